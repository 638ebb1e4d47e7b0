/* gpu_matvec_chain.cu: the decode matvecs of one Llama-3-8B step (32 layers x q|k|v, o,
 * gate|up, down, then the output head; 32 distinct matrices per shape, so nothing stays in L2),
 * chained in one CUDA graph with programmatic dependent launch as qforge's decode graph, for
 * variants of the one-token kernel: R rows per warp group, U 16-byte loads per lane and row in
 * flight, W groups x P K-splitting warps per block, plain / L1::no_allocate / L2 evict-first
 * weight loads. Random bits (f16 scales kept finite), q4_0 in qforge's G8 layout or f16. It
 * prints each shape's time against a pure read of the same bytes, and the whole chain's time as
 * a share of the 4.8 TB/s bound (bench_gpu's). docs/gpu.md "Session 18" has the H200 numbers.
 *   make build/bench/gpu_matvec_chain        (needs nvcc; not part of `all`)
 *   build/bench/gpu_matvec_chain [TINY] [f16|q4] [nopf|bulk|l2pf|cpa|occ|hyb|dyn]  (TINY: 1-block kernels per layer, default 0)
 * Then (q4_0) the same step as ONE persistent kernel: the matvecs (and the TINY one-block
 * phases, run by block 0) as phases separated by a grid barrier (an arrival counter and a
 * generation flag), 2 to 16 blocks per SM, with and without an L2 prefetch of the next
 * matvec's first lines before each barrier: docs/gpu.md "Session 20" (it loses to the chain).
 * And (q4_0, unless the third argument is "nopf") the step laid out as the decode graph, 7
 * one-block kernels a layer, the first after q|k|v also asking L2 for the head of the layer's
 * gate|up (bulk or per-line prefetches, 8-48 MB): docs/gpu.md "Session 21" (no gain).
 * With "bulk" as the third argument (q4_0; docs/gpu.md "Session 24", neither kept): the shipped
 * kernels against one whose blocks stream their rows into a shared-memory ring with
 * cp.async.bulk (its outputs checked against the shipped kernel's first), and the step as the
 * decode graph lays it out now (4 one-block kernels a layer: "graph4") with flags in global
 * memory between the kernels instead of griddepcontrol.wait ("flags").
 * With "l2pf" (q4_0; docs/gpu.md "Session 36", not kept): the graph4 step against the same step
 * with a paced L2 prefetcher forked beside it on a second stream of the graph. With "cpa"
 * (q4_0; the same session, not kept): the shipped kernels against k_q4c, whose blocks copy their
 * whole weight slice into shared memory by cp.async before the PDL wait; outputs checked first.
 * With "occ" (q4_0; docs/gpu.md "Session 37", no gain): the graph4 step with the kernels held
 * to 7 / 8 / 10 / 12 resident blocks an SM by __launch_bounds__ (k_q4m).
 * With "hyb" (q4_0; docs/gpu.md "Session 39"): the graph4 step against the same step in which
 * each kernel that follows a one-block kernel polls a flag that block stores (release) instead
 * of griddepcontrol.wait; kernels after a matvec still wait by PDL (k_tiny_h, k_q4h).
 * With "dyn" (q4_0; docs/gpu.md "Session 49"): the graph4 step against one persistent kernel with
 * a done counter a phase instead of grid barriers (k_dyn): tiles claimed in order from an atomic
 * counter (1, 2 or 4 row groups each) or a static round robin; each tile's first weights loaded
 * before it waits for the previous phase; the last two rows (static, claimed 2) held to 7 blocks
 * an SM, the shipped kernel's. R4 row groups for every shape (-DQF_DYN_ONE=0: R2 for down, as
 * shipped, at 156 registers).
 * A standalone program: it links nothing of qforge; its matvecs are the experiment's copies (the
 * shipped ones are cuda_gemm.cu's k_mv1_q4g / k_mv1_h), its norm is cuda_norm.cu's, included. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

/* qforge's RMSNorm (k_rmsnorm4, the decode step's norm with its q8_0 activation), the tree's own
 * kernel: the bench times it in graph4's one-block places ("hyb"). cuda_norm.cu's launchers
 * name cu_pdl, which the plugin defines; here it is on, as while the decode graph is captured. */
#include "kernels/cuda/cuda_norm.cu"
bool cu_pdl(void) { return true; }

#define CKE(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)
#define QK 32
#define GRP 144

__device__ __forceinline__ void trig() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void gwait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ float h2f(unsigned short b) { return __half2float(__ushort_as_half(b)); }
__device__ __forceinline__ float wsum(float v) { for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o); return v; }

__device__ __forceinline__ uint4 ldw(const void *p, int mode) {
    uint4 r;
    if (mode == 0) r = __ldg((const uint4 *)p);
    else if (mode == 1) asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    else {
        uint64_t pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
    }
    return r;
}

// the q8 activation's block b: its 32 quants, their sum and its scale
struct q8blk { int4 a0, a1; int sx; float dx; };
__device__ __forceinline__ q8blk q8_at(const int8_t *__restrict__ xq, const float *__restrict__ xd, const int *__restrict__ xs, int b) {
    const int4 *xa = (const int4 *)(xq + (size_t)b * QK);
    return {__ldg(xa), __ldg(xa + 1), __ldg(xs + b), __ldg(xd + b)};
}
// the integer dot of one q4_0 block's 16 quant bytes q with the q8 activation block a0 | a1
__device__ __forceinline__ int q4dot(const uint4 &q, const int4 &a0, const int4 &a1) {
    int s = __dp4a((int)q.x & 0x0F0F0F0F, a0.x, 0);
    s = __dp4a((int)q.y & 0x0F0F0F0F, a0.y, s);
    s = __dp4a((int)q.z & 0x0F0F0F0F, a0.z, s);
    s = __dp4a((int)q.w & 0x0F0F0F0F, a0.w, s);
    s = __dp4a(((int)q.x >> 4) & 0x0F0F0F0F, a1.x, s);
    s = __dp4a(((int)q.y >> 4) & 0x0F0F0F0F, a1.y, s);
    s = __dp4a(((int)q.z >> 4) & 0x0F0F0F0F, a1.z, s);
    return __dp4a(((int)q.w >> 4) & 0x0F0F0F0F, a1.w, s);
}
// the end of both kernels: each warp's R sums reduced, the P parts of a group added in order
template <int R, int W, int P>
__device__ __forceinline__ void group_store(const float *acc, int warp, int lane, int part, int r0, int N, float *y) {
    __shared__ float red[W * P][R];
#pragma unroll
    for (int j = 0; j < R; j++) {
        const float v = wsum(acc[j]);
        if (lane == 0) red[warp][j] = v;
    }
    if (P > 1) __syncthreads();
    if (part == 0 && lane < R && r0 + lane < N) {
        float v = 0;
        for (int p = 0; p < P; p++) v += red[warp + p][lane];
        y[r0 + lane] = v;
    }
}

// ---- flags instead of griddepcontrol.wait: each kernel's blocks add one to its counter when
// done (release), the next kernel's blocks wait for the count (acquire) before reading ----
__device__ __forceinline__ unsigned ld_acq(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fwait(const unsigned *c, unsigned target, int ns) {
    if (threadIdx.x == 0 && c)
        while (ld_acq(c) < target)
            if (ns) __nanosleep(ns);
    __syncthreads();
}
__device__ __forceinline__ void fsignal(unsigned *c) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    }
}
// R rows per warp group of P warps, W groups: the row group rg of a matvec (the weights of the
// first step are loaded before the wait; WAIT 1: the PDL wait, 2: flags, 0: none)
template <int R, int U, int W, int P, int MODE, int WAIT>
__device__ __forceinline__ void mv_rows(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                        const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                        const int *__restrict__ xs, float *y, int rg,
                                        const unsigned *wc = nullptr, unsigned wt = 0, int ns = 0) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = warp / P, part = warp % P;
    const int r0 = (rg * W + grp) * R;
    const int nb = K / QK;
    float acc[R];
    uint4 qv[R][U];
    unsigned short dv[R][U];
#pragma unroll
    for (int j = 0; j < R; j++) acc[j] = 0.f;
    int b0 = lane + 32 * part;
    constexpr int S = 32 * P;
    auto load = [&](int b0) {
#pragma unroll
        for (int j = 0; j < R; j++) {
            const uint8_t *row = Wt + (size_t)min(r0 + j, N - 1) * rb;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int b = b0 + S * u;
                if (b < nb) {
                    const uint8_t *gp = row + (size_t)(b >> 3) * GRP;
                    qv[j][u] = ldw(gp + 16 + 16 * (b & 7), MODE);
                    dv[j][u] = __ldg((const unsigned short *)gp + (b & 7));
                }
            }
        }
    };
    load(b0);
    if (WAIT == 1) gwait();
    if (WAIT == 2) fwait(wc, wt, ns);
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int b = b0 + S * u;
            if (b >= nb) break;
            const q8blk a = q8_at(xq, xd, xs, b);
#pragma unroll
            for (int j = 0; j < R; j++) acc[j] += (float)(q4dot(qv[j][u], a.a0, a.a1) - 8 * a.sx) * h2f(dv[j][u]) * a.dx;
        }
        b0 += S * U;
        if (b0 >= nb) break;
        load(b0);
    }
    group_store<R, W, P>(acc, warp, lane, part, r0, N, y);
}

template <int R, int U, int W, int P, int MODE>
__global__ void __launch_bounds__(W * P * 32) k_q4x(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                                   const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                   const int *__restrict__ xs, float *y) {
    trig();
    mv_rows<R, U, W, P, MODE, 1>(Wt, rb, K, N, xq, xd, xs, y, blockIdx.x);
}
// k_q4x held to MINB resident blocks an SM (__launch_bounds__' second argument)
template <int R, int U, int W, int P, int MINB>
__global__ void __launch_bounds__(W * P * 32, MINB) k_q4m(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                                         const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                         const int *__restrict__ xs, float *y) {
    trig();
    mv_rows<R, U, W, P, 2, 1>(Wt, rb, K, N, xq, xd, xs, y, blockIdx.x);
}

// ---- bulk: the weights streamed into a shared-memory ring by the copy engine (cp.async.bulk) ----
// One block of NT threads per SM (or bps), each a contiguous, equal share of the rows; chunks of
// rc whole rows, nst of them in flight, the first nst issued before the PDL wait (so the ring
// fills while the predecessor drains); the activation staged in shared memory after the wait.
__device__ __forceinline__ uint32_t s32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mb_init(uint64_t *b, unsigned cnt) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(s32(b)), "r"(cnt) : "memory");
}
__device__ __forceinline__ void bulk_ld(void *dst, const void *src, unsigned bytes, uint64_t *b, uint64_t pol) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(s32(b)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(s32(dst)), "l"(src), "r"(bytes), "r"(s32(b)), "l"(pol) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t *b, unsigned parity) {
    uint32_t ok;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok) : "r"(s32(b)), "r"(parity) : "memory");
    } while (!ok);
}
template <int NT, bool FENCE>
__global__ void __launch_bounds__(NT) k_q4b(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                            const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                            const int *__restrict__ xs, float *y, int rc, int nst) {
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ uint64_t bar[64];
    __shared__ float red[2][NT / 32];
    trig();
    const int nb = K / QK;
    const int r0 = (int)((long long)N * blockIdx.x / gridDim.x), r1 = (int)((long long)N * (blockIdx.x + 1) / gridDim.x);
    const int nch = (r1 - r0 + rc - 1) / rc;
    const size_t chb = (size_t)rc * rb;
    uint8_t *ring = sm;
    int8_t *aq = (int8_t *)(sm + nst * chb);
    float *ad = (float *)(aq + K);
    int *as = (int *)(ad + nb);
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    if (threadIdx.x == 0) {
        for (int i = 0; i < nst; i++) mb_init(&bar[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int c = 0; c < nst && c < nch; c++) {
            const int ra = r0 + c * rc, n = min(rc, r1 - ra);
            bulk_ld(ring + c * chb, Wt + (size_t)ra * rb, (unsigned)(n * rb), &bar[c], pol);
        }
    }
    gwait();
    for (int i = threadIdx.x; i < K / 16; i += NT) ((int4 *)aq)[i] = __ldg((const int4 *)xq + i);
    for (int i = threadIdx.x; i < nb; i += NT) ad[i] = __ldg(xd + i), as[i] = __ldg(xs + i);
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, P = (NT / 32) / rc, row = warp / P, part = warp % P;
    for (int c = 0; c < nch; c++) {
        const int s = c % nst, ra = r0 + c * rc, n = min(rc, r1 - ra);
        mb_wait(&bar[s], (unsigned)(c / nst) & 1u);
        float acc = 0.f;
        if (row < n) {
            const uint8_t *rp = ring + s * chb + (size_t)row * rb;
            for (int b = lane + 32 * part; b < nb; b += 32 * P) {
                const uint8_t *gp = rp + (b >> 3) * GRP;
                const uint4 q = *(const uint4 *)(gp + 16 + 16 * (b & 7));
                const unsigned short d = ((const unsigned short *)gp)[b & 7];
                const int4 a0 = ((const int4 *)(aq + b * QK))[0], a1 = ((const int4 *)(aq + b * QK))[1];
                acc += (float)(q4dot(q, a0, a1) - 8 * as[b]) * h2f(d) * ad[b];
            }
        }
        acc = wsum(acc);
        if (lane == 0) red[c & 1][warp] = acc;
        __syncthreads(); /* every warp is done with slot s */
        if (threadIdx.x == 0 && c + nst < nch) {
            if (FENCE) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const int rn = r0 + (c + nst) * rc, nn = min(rc, r1 - rn);
            bulk_ld(ring + s * chb, Wt + (size_t)rn * rb, (unsigned)(nn * rb), &bar[s], pol);
        }
        if (part == 0 && lane == 0 && row < n) {
            float v = 0.f;
            for (int p = 0; p < P; p++) v += red[c & 1][row * P + p];
            y[ra + row] = v;
        }
    }
}

template <int R, int U, int W, int P>
__global__ void __launch_bounds__(W * P * 32) k_q4f(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                                   const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                   const int *__restrict__ xs, float *y, const unsigned *wc,
                                                   unsigned wt, unsigned *sc, int ns) {
    trig();
    mv_rows<R, U, W, P, 2, 2>(Wt, rb, K, N, xq, xd, xs, y, blockIdx.x, wc, wt, ns);
    fsignal(sc);
}
__global__ void k_tiny_f(float *y, int n, const unsigned *wc, unsigned wt, unsigned *sc, int ns) {
    trig();
    fwait(wc, wt, ns);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = y[i] * 0.5f + 1.f;
    fsignal(sc);
}

// ---- the persistent variant: one kernel, a grid barrier between phases ----
// (all blocks must be resident: the grid is sized from the occupancy query below)
struct phase { const uint8_t *w; size_t rb; int K, N; int tiny; };
__device__ __forceinline__ void gbar(unsigned *cnt, unsigned *gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = *(volatile unsigned *)gen;
        __threadfence();
        if (atomicAdd(cnt, 1) == gridDim.x - 1) {
            *(volatile unsigned *)cnt = 0;
            __threadfence();
            atomicAdd(gen, 1);
        } else
            while (*(volatile unsigned *)gen == g) {}
        __threadfence();
    }
    __syncthreads();
}
// PF: before each barrier, L2-prefetch the first lines of this block's first row group of the next matvec phase
template <int R, int U, int W, int P, int PF>
__global__ void __launch_bounds__(W * P * 32) k_persist(const phase *ph, int nph, const int8_t *__restrict__ xq,
                                                      const float *__restrict__ xd, const int *__restrict__ xs, float *y,
                                                      float *yt, unsigned *bar) {
    for (int p = 0; p < nph; p++) {
        const phase P_ = ph[p];
        if (P_.tiny) {
            if (blockIdx.x == 0)
                for (int i = threadIdx.x; i < P_.tiny; i += blockDim.x) yt[i] = yt[i] * 0.5f + 1.f;
        } else {
            const int ngr = (P_.N + W * R - 1) / (W * R);
            for (int g = blockIdx.x; g < ngr; g += gridDim.x) {
                mv_rows<R, U, W, P, 2, 0>(P_.w, P_.rb, P_.K, P_.N, xq, xd, xs, y, g);
                __syncthreads(); /* group_store's shared sums are reused by the next row group */
            }
        }
        if (PF) {
            for (int q = p + 1; q < nph; q++)
                if (!ph[q].tiny) {
                    const phase Q = ph[q];
                    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = warp / P, part = warp % P;
                    const int r0 = (blockIdx.x * W + grp) * R, nb = Q.K / QK;
                    for (int j = 0; j < R; j++)
                        for (int u = 0; u < PF; u++) {
                            const int b = lane + 32 * part + 32 * P * u;
                            if (b < nb && r0 + j < Q.N) {
                                const uint8_t *gp = Q.w + (size_t)(r0 + j) * Q.rb + (size_t)(b >> 3) * GRP + 16 + 16 * (b & 7);
                                asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(gp));
                            }
                        }
                    break;
                }
        }
        gbar(bar, bar + 1);
    }
}

// ---- dyn: the same step as one persistent kernel without grid barriers. Each phase (a matvec
// or a one-block stand-in) has a done counter; a tile of phase p loads its first weights, then
// waits (acquire) until phase p - 1's counter is complete, computes, stores and adds one to its
// own counter (release). DYN: tiles of CH row groups claimed in order from one atomic counter
// (the claim order makes it deadlock-free with every block resident); static: row group g of
// every phase taken by block (tstart + g) % gridDim.x, continuing the round robin across phases,
// each block adding one to the counter once it has done all of its row groups of the phase.
// (The weights and activations are the bench's stand-ins; a real kernel would read its inputs
// after the acquire through the coherent path, not ld.global.nc.) ----
#ifndef QF_DYN_ONE
#define QF_DYN_ONE 1 /* 0: R2 row groups for down as the shipped kernel (two shapes: 156 registers, not 70) */
#endif
struct dphase { const uint8_t *w; size_t rb; int K, N; int tiny; int ngr, ntile, tstart; unsigned target; };
__device__ __forceinline__ void dyn_tile(const dphase &P_, int g0, int g1, const int8_t *__restrict__ xq,
                                         const float *__restrict__ xd, const int *__restrict__ xs, float *y, float *yt,
                                         const unsigned *wc, unsigned wt, int ns) {
    if (P_.tiny) {
        fwait(wc, wt, ns);
        for (int i = threadIdx.x; i < P_.tiny; i += blockDim.x) yt[i] = yt[i] * 0.5f + 1.f;
        return;
    }
    for (int g = g0; g < g1; g++) {
        if (QF_DYN_ONE) /* one instantiation: R4 for every shape, down too */
            mv_rows<4, 2, 2, 2, 2, 2>(P_.w, P_.rb, P_.K, P_.N, xq, xd, xs, y, g, g == g0 ? wc : nullptr, wt, ns);
        else if (P_.K >= 8192) {
            if (g == g0) mv_rows<2, 2, 2, 2, 2, 2>(P_.w, P_.rb, P_.K, P_.N, xq, xd, xs, y, g, wc, wt, ns);
            else mv_rows<2, 2, 2, 2, 2, 0>(P_.w, P_.rb, P_.K, P_.N, xq, xd, xs, y, g);
        } else {
            if (g == g0) mv_rows<4, 2, 2, 2, 2, 2>(P_.w, P_.rb, P_.K, P_.N, xq, xd, xs, y, g, wc, wt, ns);
            else mv_rows<4, 2, 2, 2, 2, 0>(P_.w, P_.rb, P_.K, P_.N, xq, xd, xs, y, g);
        }
        __syncthreads(); /* group_store's shared sums are reused by the next row group */
    }
}
template <int CH, bool DYN, int MINB>
__global__ void __launch_bounds__(128, MINB) k_dyn(const dphase *__restrict__ ph, int nph, int total,
                                             const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                             const int *__restrict__ xs, float *y, float *yt, unsigned *ctr, int ns) {
    unsigned *done = ctr + 1;
    if (DYN) {
        __shared__ int s_t;
        int p = 0;
        for (;;) {
            if (threadIdx.x == 0) s_t = (int)atomicAdd(ctr, 1u);
            __syncthreads();
            const int t = s_t;
            __syncthreads();
            if (t >= total) return;
            while (p + 1 < nph && t >= ph[p + 1].tstart) p++;
            const dphase P_ = ph[p];
            const int lt = t - P_.tstart, g0 = lt * CH, g1 = min(g0 + CH, P_.ngr);
            dyn_tile(P_, g0, g1, xq, xd, xs, y, yt, p ? done + p - 1 : nullptr, p ? ph[p - 1].target : 0, ns);
            fsignal(done + p);
        }
    } else {
        const int G = gridDim.x;
        for (int p = 0; p < nph; p++) {
            const dphase P_ = ph[p];
            /* this block's first row group of the phase: the g with (tstart + g) % G == blockIdx.x */
            int g = ((int)blockIdx.x - P_.tstart % G + G) % G;
            if (g >= P_.ngr) continue;
            const unsigned *wc = p ? done + p - 1 : nullptr;
            const unsigned wt = p ? ph[p - 1].target : 0;
            for (; g < P_.ngr; g += G) {
                dyn_tile(P_, g, g + 1, xq, xd, xs, y, yt, wc, wt, ns);
                wc = nullptr; /* waited once */
            }
            fsignal(done + p);
        }
    }
}

__device__ __forceinline__ void h8f(uint4 u, float *w) {
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) { float2 f = __half22float2(h[i]); w[2 * i] = f.x; w[2 * i + 1] = f.y; }
}
template <int R, int U, int W, int P, int MODE>
__global__ void __launch_bounds__(W * P * 32) k_hx(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                                  const int8_t *__restrict__ xq_, const float *__restrict__ x,
                                                  const int *__restrict__ xs_, float *y) {
    trig();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = warp / P, part = warp % P;
    const int r0 = (blockIdx.x * W + grp) * R;
    const int nc = K / 8;
    float acc[R];
    uint4 qv[R][U];
#pragma unroll
    for (int j = 0; j < R; j++) acc[j] = 0.f;
    int c0 = lane + 32 * part;
    constexpr int S = 32 * P;
    auto load = [&](int c0) {
#pragma unroll
        for (int j = 0; j < R; j++) {
            const uint4 *row = (const uint4 *)(Wt + (size_t)min(r0 + j, N - 1) * rb);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + S * u;
                if (c < nc) qv[j][u] = ldw(row + c, MODE);
            }
        }
    };
    load(c0);
    gwait();
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + S * u;
            if (c >= nc) break;
            const float4 *xp = (const float4 *)x;
            const float4 a0 = __ldg(xp + 2 * c), a1 = __ldg(xp + 2 * c + 1);
#pragma unroll
            for (int j = 0; j < R; j++) {
                float w[8];
                h8f(qv[j][u], w);
                acc[j] += w[0] * a0.x + w[1] * a0.y + w[2] * a0.z + w[3] * a0.w + w[4] * a1.x + w[5] * a1.y + w[6] * a1.z + w[7] * a1.w;
            }
        }
        c0 += S * U;
        if (c0 >= nc) break;
        load(c0);
    }
    group_store<R, W, P>(acc, warp, lane, part, r0, N, y);
}

// pure read ceiling: every byte once, 16-byte loads, 4 in flight per thread
__global__ void __launch_bounds__(256) k_read(const uint4 *__restrict__ p, size_t n16, float *y) {
    trig();
    uint32_t acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n16; i += stride) acc ^= __ldg(p + i).x;
    gwait();
    if (acc == 0x12345678u) y[0] = 1.f;
}

// a tiny kernel standing for a norm / quant / attention launch (1 block)
__global__ void k_tiny(float *y, int n) {
    trig();
    gwait();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = y[i] * 0.5f + 1.f;
}

// ---- hyb: griddepcontrol.wait where the predecessor is a matvec (its hundreds of blocks'
// completion is the hardware's to detect), a flag where it is a one-block kernel: that block
// stores 1 with release semantics once its writes are done, and its successor's blocks poll the
// flag (acquire) instead of waiting for the one-block grid's completion and memory flush ----
__global__ void k_tiny_h(float *y, int n, const unsigned *wc, unsigned *sc, int ns) {
    trig();
    if (wc) fwait(wc, 1, ns);
    else gwait();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = y[i] * 0.5f + 1.f;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(sc), "r"(1u) : "memory");
    }
}
// the same place in the chain with no work: what a kernel boundary costs by itself
__global__ void k_tiny_e(float *y, int n) {
    trig();
    gwait();
    if (n < 0) y[0] = 0.f;
}
// a norm's shape: NV float4 of x a thread loaded at once, the block's sum of squares, the
// scaled row written back (one L2 round trip each way)
template <int NV>
__global__ void k_tiny_n(float *y, int n) {
    trig();
    gwait();
    __shared__ float red[32];
    float4 v[NV];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        v[k] = ((const float4 *)y)[threadIdx.x + k * blockDim.x];
        ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    const float sc = rsqrtf(block_sum(ss, red) / n + 1e-5f) * 0.999f;
#pragma unroll
    for (int k = 0; k < NV; k++)
        ((float4 *)y)[threadIdx.x + k * blockDim.x] = make_float4(v[k].x * sc, v[k].y * sc, v[k].z * sc, v[k].w * sc);
}
template <int R, int U, int W, int P>
__global__ void __launch_bounds__(W * P * 32) k_q4h(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                                   const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                   const int *__restrict__ xs, float *y, const unsigned *wc, int ns) {
    trig();
    mv_rows<R, U, W, P, 2, 2>(Wt, rb, K, N, xq, xd, xs, y, blockIdx.x, wc, 1u, ns);
}

// a small kernel that, once its predecessor is done, asks L2 for `bytes` of another matrix
// (cp.async.bulk.prefetch.L2 in 64 KB pieces spread over its threads; EL: evict-last hint),
// standing for a split / norm launch that warms the next big matvec's weights
template <int EL>
__global__ void k_tiny_pf(float *y, int n, const uint8_t *pf, size_t bytes) {
    trig();
    gwait();
    if (EL >= 2) { // per-line prefetch instructions (2: L2 normal, 3: L2 evict_last) spread over all threads
        const size_t nl = bytes / 128;
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nl; i += (size_t)gridDim.x * blockDim.x) {
            if (EL == 3) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(pf + i * 128));
            else asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + i * 128));
        }
        if (blockIdx.x == 0)
            for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = y[i] * 0.5f + 1.f;
        return;
    }
    const size_t piece = bytes / gridDim.x / 16 * 16 < 65536 ? bytes / gridDim.x / 16 * 16 + 16 : 65536, np = (bytes + piece - 1) / piece;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < np; i += (size_t)gridDim.x * blockDim.x) {
        const uint8_t *a = pf + i * piece;
        const unsigned sz = (unsigned)(i + 1 < np ? piece : bytes - i * piece) & ~15u;
        if (!sz) continue;
        if (EL) {
            uint64_t pol;
            asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
            asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(a), "r"(sz), "l"(pol) : "memory");
        } else
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(sz) : "memory");
    }
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = y[i] * 0.5f + 1.f;
}


// ---- cpa: the whole weight slice of a block asked for before the PDL wait, into shared memory ----
// As mv_rows (R rows a warp group, W groups x P warps, lane's blocks b0 + S u), but every one of
// the lane's NBL blocks of each row is copied by cp.async (16 bytes) into the block's shared
// memory before griddepcontrol.wait: no registers hold them, so more blocks are resident and
// more bytes are in flight while the predecessor drains. Scales by __ldg. docs/gpu.md "Session
// 36": slower than the shipped register loads in every shape (graph4 0.87x on an H100).
__device__ __forceinline__ void cpa16(void *dst, const void *src) {
    /* no L2 hint: "cp.async.cg.shared.global.L2::cache_hint [d], [s], 16{, 16}, policy" builds
     * (nvcc 13.0) but faults with an illegal instruction on the H100 (session 36) */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}
template <int R, int NBL, int W, int P>
__global__ void __launch_bounds__(W * P * 32) k_q4c(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                                   const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                   const int *__restrict__ xs, float *y) {
    extern __shared__ __align__(16) uint4 cq[]; // [R][NBL][threads]
    trig();
    constexpr int NT = W * P * 32, S = 32 * P;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = warp / P, part = warp % P;
    const int r0 = (blockIdx.x * W + grp) * R, nb = K / QK, b0 = lane + 32 * part;
    unsigned short dv[R][NBL];
#pragma unroll
    for (int j = 0; j < R; j++) {
        const uint8_t *row = Wt + (size_t)min(r0 + j, N - 1) * rb;
#pragma unroll
        for (int u = 0; u < NBL; u++) {
            const int b = b0 + S * u;
            if (b < nb) {
                const uint8_t *gp = row + (size_t)(b >> 3) * GRP;
                cpa16(&cq[(j * NBL + u) * NT + threadIdx.x], gp + 16 + 16 * (b & 7));
                dv[j][u] = __ldg((const unsigned short *)gp + (b & 7));
            }
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    gwait();
    float acc[R];
#pragma unroll
    for (int j = 0; j < R; j++) acc[j] = 0.f;
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int u = 0; u < NBL; u++) {
        const int b = b0 + S * u;
        if (b >= nb) break;
        const q8blk a = q8_at(xq, xd, xs, b);
#pragma unroll
        for (int j = 0; j < R; j++)
            acc[j] += (float)(q4dot(cq[(j * NBL + u) * NT + threadIdx.x], a.a0, a.a1) - 8 * a.sx) * h2f(dv[j][u]) * a.dx;
    }
    group_store<R, W, P>(acc, warp, lane, part, r0, N, y);
}

// ---- l2pf: a paced L2 prefetcher beside the chain (not on its critical path) ----
// The matvecs of the step, in the order the chain reads them, are segments of one byte stream.
// Each matvec's block 0 stores its segment index into *prog once past the PDL wait; the
// prefetcher (a kernel on a forked stream of the same graph, joined only at the step's end)
// asks L2 for the stream's chunks of CH bytes, chunk k by block k % gridDim.x, each no further
// than W bytes past the start of the consumer's segment. So HBM keeps streaming while the chain
// waits on its one-block kernels and kernel boundaries, and the matvecs find their first bytes in L2.
struct pseg { const uint8_t *p; unsigned long long bytes, off; };
__device__ __forceinline__ unsigned ld_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
template <int R, int U, int W, int P, int MODE>
__global__ void __launch_bounds__(W * P * 32) k_q4s(const uint8_t *__restrict__ Wt, size_t rb, int K, int N,
                                                   const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                   const int *__restrict__ xs, float *y, unsigned *prog, unsigned idx,
                                                   int early) {
    trig();
    if (early && blockIdx.x == 0 && threadIdx.x == 0) asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(prog), "r"(idx) : "memory");
    if (!early) { /* the signal after the wait: the chain has reached this matvec */
        gwait();
        if (blockIdx.x == 0 && threadIdx.x == 0) asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(prog), "r"(idx) : "memory");
    }
    mv_rows<R, U, W, P, MODE, 1>(Wt, rb, K, N, xq, xd, xs, y, blockIdx.x);
}
// mode 0: per-line prefetch.global.L2 from the warp's lanes; 1: cp.async.bulk.prefetch.L2 pieces
__global__ void __launch_bounds__(32) k_l2pf(const pseg *sg, int ns, const unsigned *prog, unsigned long long W,
                                             unsigned CH, int mode) {
    const int lane = threadIdx.x;
    unsigned long long k = 0;
    unsigned cur = 0;
    for (int m = 0; m < ns; m++) {
        const pseg g = sg[m];
        for (unsigned long long o = 0; o < g.bytes; o += CH, k++) {
            if (k % gridDim.x != blockIdx.x) continue;
            const unsigned long long len = g.bytes - o < CH ? g.bytes - o : CH;
            if (g.off + o + len > sg[ns - 1].off + W) return; /* past what the last segment's start allows */
            if (lane == 0) /* wait until the chunk's end is within W of the consumer's segment start */
                while (g.off + o + len > sg[cur].off + W) {
                    __nanosleep(256);
                    unsigned c = ld_relaxed(prog);
                    cur = c < (unsigned)ns ? c : ns - 1;
                }
            __syncwarp();
            const uint8_t *a = g.p + o;
            if (mode == 0) {
                for (unsigned long long i = (unsigned long long)lane * 128; i < len; i += 32 * 128)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(a + i));
            } else {
                const unsigned long long piece = (len / 32 + 15) / 16 * 16;
                const unsigned long long b = (unsigned long long)lane * piece;
                if (b < len) {
                    const unsigned sz = (unsigned)(len - b < piece ? len - b : piece);
                    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a + b), "r"(sz) : "memory");
                }
            }
        }
    }
}

__global__ void k_fill(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        // keep f16 scales finite: clear the exponent's top bit in every 16-bit half
        p[i] = h & 0x3FFF3FFFu;
    }
}

typedef void (*kfn)(const uint8_t *, size_t, int, int, const int8_t *, const float *, const int *, float *);

struct variant { const char *name; kfn f; int rows_per_block; int threads; int bps = 0, ring_kb = 0, chunk_kb = 16; bool fence = false; };

static bool g_pdl = true;
// f<<<grid, threads, smem, s>>>(args), with programmatic dependent launch while g_pdl is set
static void launch(const void *f, unsigned grid, unsigned threads, void **args, cudaStream_t s, size_t smem = 0) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid); cfg.blockDim = dim3(threads); cfg.stream = s; cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = g_pdl ? 1 : 0;
    cfg.attrs = at; cfg.numAttrs = 1;
    CKE(cudaLaunchKernelExC(&cfg, f, args));
}

struct mat { uint8_t *w; size_t rb; int K, N; };

static int g_nsm = 132;
static void run_mv(const variant &v, const mat &m, const int8_t *xq, const float *xd, const int *xs, float *y, cudaStream_t s) {
    const uint8_t *w = m.w; size_t rb = m.rb; int K = m.K, N = m.N;
    if (v.bps) { /* bulk: rows per chunk a divisor of the block's 8 warps */
        int rc = (int)((size_t)v.chunk_kb * 1024 / rb);
        rc = rc >= 8 ? 8 : rc >= 4 ? 4 : rc >= 2 ? 2 : 1;
        int nst = (int)((size_t)v.ring_kb * 1024 / (rc * rb));
        if (nst > 64) nst = 64;
        if (nst < 2) nst = 2;
        const size_t smem = nst * rc * rb + K + K / 32 * 8;
        void *args[] = {(void *)&w, &rb, &K, &N, (void *)&xq, (void *)&xd, (void *)&xs, &y, &rc, &nst};
        launch(v.fence ? (const void *)k_q4b<256, true> : (const void *)k_q4b<256, false>, g_nsm * v.bps, 256, args, s, smem);
        return;
    }
    void *args[] = {(void *)&w, &rb, &K, &N, (void *)&xq, (void *)&xd, (void *)&xs, &y};
    launch((const void *)v.f, (unsigned)((N + v.rows_per_block - 1) / v.rows_per_block), v.threads, args, s);
}

int main(int argc, char **argv) {
    const int L = 32, D = 4096, F = 14336, QKV = 6144, V = 128256;
    int tiny = argc > 1 ? atoi(argv[1]) : 0; // small kernels per layer
    const bool F16e = argc > 2 && !strcmp(argv[2], "f16");
    cudaStream_t s; CKE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto mk = [&](int N, int K) { mat m; m.K = K; m.N = N; m.rb = F16e ? (size_t)K * 2 : (size_t)K / 32 * 18; CKE(cudaMalloc(&m.w, m.rb * N)); k_fill<<<1024, 256>>>((uint32_t *)m.w, m.rb * N / 4, N * 31 + K); return m; };
    std::vector<mat> qkv, wo, gu, dn;
    for (int l = 0; l < L; l++) qkv.push_back(mk(QKV, D)), wo.push_back(mk(D, D)), gu.push_back(mk(2 * F, D)), dn.push_back(mk(D, F));
    mat lm = mk(V, D);
    int8_t *xq; float *xd, *y, *yt; int *xs;
    CKE(cudaMalloc(&xq, F)); CKE(cudaMalloc(&xd, F * 4)); CKE(cudaMalloc(&xs, F / 32 * 4));
    CKE(cudaMalloc(&y, (size_t)V * 4)); CKE(cudaMalloc(&yt, 16384 * 4));
    k_fill<<<64, 256>>>((uint32_t *)xq, F / 4, 7); k_fill<<<8, 256>>>((uint32_t *)xd, F, 9); k_fill<<<8, 256>>>((uint32_t *)xs, F / 32, 11);
    CKE(cudaMemset(yt, 0, 16384 * 4));
    CKE(cudaDeviceSynchronize());
    double bytes = 0;
    for (int l = 0; l < L; l++) bytes += (double)qkv[l].rb * qkv[l].N + wo[l].rb * wo[l].N + gu[l].rb * gu[l].N + dn[l].rb * dn[l].N;
    bytes += (double)lm.rb * lm.N;

    const bool F16 = F16e;
    CKE(cudaFuncSetAttribute(k_q4b<256, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    CKE(cudaFuncSetAttribute(k_q4b<256, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    cudaDeviceGetAttribute(&g_nsm, cudaDevAttrMultiProcessorCount, 0);
    std::vector<variant> vs;
    const bool bulk_only = argc > 3 && !strcmp(argv[3], "bulk");
    if (!F16 && bulk_only) vs = {
        {"ef R4U2 W2P2", k_q4x<4, 2, 2, 2, 2>, 8, 128},
        {"ef R2U2 W2P2", k_q4x<2, 2, 2, 2, 2>, 4, 128},
        {"bulk 2x96K c16", nullptr, 0, 256, 2, 96, 16},
    };
    else if (!F16) vs = {
        {"base R1U4 W4", k_q4x<1, 4, 4, 1, 0>, 4, 128},
        {"ef R1U4 W4", k_q4x<1, 4, 4, 1, 2>, 4, 128},
        {"ef R2U2 W4", k_q4x<2, 2, 4, 1, 2>, 8, 128},
        {"ef R2U4 W4", k_q4x<2, 4, 4, 1, 2>, 8, 128},
        {"ef R4U2 W4", k_q4x<4, 2, 4, 1, 2>, 16, 128},
        {"ef R2U2 P4", k_q4x<2, 2, 1, 4, 2>, 2, 128},
        {"ef R4U2 P4", k_q4x<4, 2, 1, 4, 2>, 4, 128},
        {"ef R2U2 W2P2", k_q4x<2, 2, 2, 2, 2>, 4, 128},
        {"ef R4U2 W2P2", k_q4x<4, 2, 2, 2, 2>, 8, 128},
        {"ef R2U2 P8", k_q4x<2, 2, 1, 8, 2>, 2, 256},
        {"ef R4U1 P8", k_q4x<4, 1, 1, 8, 2>, 4, 256},
        {"ef R1U4 P4", k_q4x<1, 4, 1, 4, 2>, 1, 128},
        {"nol1 R4U2 P4", k_q4x<4, 2, 1, 4, 1>, 4, 128},
    };
    else vs = {
        {"base R1U4 W4", k_hx<1, 4, 4, 1, 0>, 4, 128},
        {"ef R1U4 W4", k_hx<1, 4, 4, 1, 2>, 4, 128},
        {"ef R2U2 W4", k_hx<2, 2, 4, 1, 2>, 8, 128},
        {"ef R2U4 W4", k_hx<2, 4, 4, 1, 2>, 8, 128},
        {"ef R4U2 W4", k_hx<4, 2, 4, 1, 2>, 16, 128},
        {"ef R2U2 P4", k_hx<2, 2, 1, 4, 2>, 2, 128},
        {"ef R2U4 P4", k_hx<2, 4, 1, 4, 2>, 2, 128},
        {"ef R4U2 P4", k_hx<4, 2, 1, 4, 2>, 4, 128},
        {"ef R2U2 W2P2", k_hx<2, 2, 2, 2, 2>, 4, 128},
        {"ef R1U4 P4", k_hx<1, 4, 1, 4, 2>, 1, 128},
        {"ef R1U8 W4", k_hx<1, 8, 4, 1, 2>, 4, 128},
        {"nol1 R2U4 W4", k_hx<2, 4, 4, 1, 1>, 8, 128},
    };

    if (bulk_only) { /* the bulk kernel's outputs against the shipped kernel's, each shape */
        std::vector<float> a(V), b(V);
        const mat *ms[5] = {&qkv[0], &wo[0], &gu[0], &dn[0], &lm};
        for (int i = 0; i < 5; i++)
            for (size_t k = 1; k < vs.size(); k++) {
                run_mv(vs[0], *ms[i], xq, xd, xs, y, s);
                CKE(cudaMemcpyAsync(a.data(), y, ms[i]->N * 4, cudaMemcpyDeviceToHost, s));
                CKE(cudaMemsetAsync(y, 0, ms[i]->N * 4, s));
                run_mv(vs[k], *ms[i], xq, xd, xs, y, s);
                CKE(cudaMemcpyAsync(b.data(), y, ms[i]->N * 4, cudaMemcpyDeviceToHost, s));
                CKE(cudaStreamSynchronize(s));
                double num = 0, den = 0;
                for (int r = 0; r < ms[i]->N; r++) num += (double)(a[r] - b[r]) * (a[r] - b[r]), den += (double)a[r] * a[r];
                if (!(num <= 1e-10 * den)) printf("MISMATCH %s shape %d: nmse %g\n", vs[k].name, i, num / den);
            }
        printf("bulk check done\n");
    }
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    // 1) each shape alone: mean over 32 distinct layer matrices (cold L2), plain launches with PDL, in a graph
    const char *shn[5] = {"qkv 6144x4096", "wo 4096x4096", "gu 28672x4096", "down 4096x14336", "lm 128256x4096"};
    auto time_graph = [&](auto body, int reps) {
        cudaGraph_t g; cudaGraphExec_t ge;
        CKE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        body();
        CKE(cudaStreamEndCapture(s, &g)); CKE(cudaGraphInstantiate(&ge, g, 0));
        CKE(cudaGraphLaunch(ge, s)); CKE(cudaStreamSynchronize(s));
        CKE(cudaEventRecord(e0, s));
        for (int r = 0; r < reps; r++) CKE(cudaGraphLaunch(ge, s));
        CKE(cudaEventRecord(e1, s)); CKE(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
        return ms / reps;
    };

    // one matvec by the kernels as shipped (k_mv1_q4g's shapes: 4 rows a group, 2 where K >= 8192)
    auto ship_launch = [&](const mat &m, cudaStream_t st) {
        const uint8_t *w = m.w; size_t rb = m.rb; int K = m.K, N = m.N;
        void *b[] = {(void *)&w, &rb, &K, &N, (void *)&xq, (void *)&xd, (void *)&xs, &y};
        if (K >= 8192) launch((const void *)k_q4x<2, 2, 2, 2, 2>, (N + 3) / 4, 128, b, st);
        else launch((const void *)k_q4x<4, 2, 2, 2, 2>, (N + 7) / 8, 128, b, st);
    };
    // one step as the decode graph lays it out (graph4: norm, q|k|v, split / attention / merge
    // standing as two one-block kernels, o, norm, gate|up, down; then the output head); mv(m)
    // launches one matvec
    auto graph4w = [&](auto mv, auto tiny) { /* tiny() launches one one-block kernel */
        for (int l = 0; l < L; l++) {
            tiny(); mv(qkv[l]); tiny(); tiny(); mv(wo[l]); tiny(); mv(gu[l]); mv(dn[l]);
        }
        mv(lm);
    };
    auto graph4 = [&](auto mv) { /* with k_tiny, the stand-in */
        void *ta[] = {&yt, (void *)&D};
        graph4w(mv, [&] { launch((const void *)k_tiny, 1, 256, ta, s); });
    };
    // occ (third argument): the graph4 step with the shipped kernels held to MINB resident blocks
    // an SM (__launch_bounds__ min blocks: fewer registers, more weight bytes in flight before the wait)
    if (!F16 && argc > 3 && !strcmp(argv[3], "occ")) {
        g_pdl = true;
        struct ocase { const char *name; const void *k4, *k2; };
        const ocase cs[] = {{"min 1 (shipped)", (const void *)k_q4x<4, 2, 2, 2, 2>, (const void *)k_q4x<2, 2, 2, 2, 2>},
                            {"min 7", (const void *)k_q4m<4, 2, 2, 2, 7>, (const void *)k_q4m<2, 2, 2, 2, 7>},
                            {"min 8", (const void *)k_q4m<4, 2, 2, 2, 8>, (const void *)k_q4m<2, 2, 2, 2, 8>},
                            {"min 10", (const void *)k_q4m<4, 2, 2, 2, 10>, (const void *)k_q4m<2, 2, 2, 2, 10>},
                            {"min 12", (const void *)k_q4m<4, 2, 2, 2, 12>, (const void *)k_q4m<2, 2, 2, 2, 12>},
                            {"R4 down, min 8", (const void *)k_q4m<4, 2, 2, 2, 8>, (const void *)k_q4m<4, 2, 2, 2, 8>}};
        for (int rep = 0; rep < 3; rep++)
            for (const ocase &c : cs) {
                float ms = time_graph([&] {
                    auto mv = [&](const mat &m) {
                        const uint8_t *w = m.w; size_t rb = m.rb; int K = m.K, N = m.N;
                        void *b[] = {(void *)&w, &rb, &K, &N, (void *)&xq, (void *)&xd, (void *)&xs, &y};
                        const bool r2 = K >= 8192 && c.k2 != c.k4;
                        launch(r2 ? c.k2 : c.k4, r2 ? (N + 3) / 4 : (N + 7) / 8, 128, b, s);
                    };
                    graph4(mv); }, 20);
                CKE(cudaGetLastError());
                int o4 = 0, o2 = 0; /* resident blocks an SM: the R4 and the down kernel */
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o4, c.k4, 128, 0);
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o2, c.k2, 128, 0);
                printf("graph4 %-18s (%2d / %2d blocks an SM) %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", c.name, o4, o2, ms,
                       1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
            }
        return 0;
    }

    // dyn (third argument): the graph4 step as shipped (PDL), with and without its one-block
    // kernels, against k_dyn (one persistent kernel, counters instead of barriers and launches)
    if (!F16 && argc > 3 && !strcmp(argv[3], "dyn")) {
        g_pdl = true;
        auto ship = [&](const mat &m) { ship_launch(m, s); };
        for (int tn : {4, 0}) { /* one-block phases a layer: graph4's 4, or none */
            std::vector<dphase> hp;
            int tot = 0;
            auto add = [&](const mat *m, int ch) {
                dphase d = {};
                if (m) {
                    const int rows = m->K >= 8192 && !QF_DYN_ONE ? 4 : 8; /* a row group: W x R rows */
                    d.w = m->w, d.rb = m->rb, d.K = m->K, d.N = m->N, d.ngr = (m->N + rows - 1) / rows;
                } else
                    d.tiny = D, d.ngr = 1;
                d.ntile = (d.ngr + ch - 1) / ch, d.tstart = tot;
                tot += d.ntile;
                hp.push_back(d);
            };
            /* ch 0: static round robin, else ch row groups a claimed tile; mb: __launch_bounds__'s minimum */
            struct dcase { int ch, mb; const void *kf; };
            const dcase cs[] = {{0, 1, (const void *)k_dyn<1, false, 1>}, {1, 1, (const void *)k_dyn<1, true, 1>},
                                {2, 1, (const void *)k_dyn<2, true, 1>},  {4, 1, (const void *)k_dyn<4, true, 1>},
                                {0, 7, (const void *)k_dyn<1, false, 7>}, {2, 7, (const void *)k_dyn<2, true, 7>}};
            for (const dcase &dc : cs) {
                const int ch = dc.ch;
                const void *kf = dc.kf;
                hp.clear(), tot = 0;
                const int c = ch ? ch : 1;
                for (int l = 0; l < L; l++) {
                    if (tn) add(nullptr, c);
                    add(&qkv[l], c);
                    if (tn) add(nullptr, c), add(nullptr, c);
                    add(&wo[l], c);
                    if (tn) add(nullptr, c);
                    add(&gu[l], c), add(&dn[l], c);
                }
                add(&lm, c);
                int occ = 0;
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kf, 128, 0);
                const int G = g_nsm * occ;
                for (auto &d : hp) d.target = ch ? (unsigned)d.ntile : (unsigned)(d.ngr < G ? d.ngr : G);
                const int nph = (int)hp.size(), nc = nph + 1;
                dphase *dph; unsigned *ctr;
                CKE(cudaMalloc(&dph, hp.size() * sizeof(dphase)));
                CKE(cudaMemcpy(dph, hp.data(), hp.size() * sizeof(dphase), cudaMemcpyHostToDevice));
                CKE(cudaMalloc(&ctr, nc * 4));
                for (int ns : {0, 64}) {
                    g_pdl = false;
                    float ms = time_graph([&] {
                        CKE(cudaMemsetAsync(ctr, 0, nc * 4, s));
                        void *a[] = {(void *)&dph, (void *)&nph, &tot, (void *)&xq, (void *)&xd, (void *)&xs, &y, &yt, &ctr, &ns};
                        launch(kf, (unsigned)G, 128, a, s); }, 20);
                    g_pdl = true;
                    CKE(cudaGetLastError());
                    printf("dyn one-block %d a layer, %s %d, ns %2d, %4d blocks (%d an SM): %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n",
                           tn, ch ? "claimed CH" : "static    ", c, ns, G, occ, ms, 1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
                }
                cudaFree(dph), cudaFree(ctr);
            }
            for (int rep = 0; rep < 2; rep++) {
                float ms = time_graph([&] {
                    void *ta[] = {&yt, (void *)&D};
                    graph4w(ship, [&] { if (tn) launch((const void *)k_tiny, 1, 256, ta, s); }); }, 20);
                CKE(cudaGetLastError());
                printf("graph4 shipped (PDL), one-block %d a layer:                      %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n",
                       tn, ms, 1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
            }
        }
        return 0;
    }

    // hyb (third argument): the graph4 step as shipped (every kernel waits by griddepcontrol.wait)
    // against the same step whose kernels after a one-block kernel poll that kernel's flag
    if (!F16 && argc > 3 && !strcmp(argv[3], "hyb")) {
        g_pdl = true;
        unsigned *ctr;
        const int nk = L * 4 + 1;
        CKE(cudaMalloc(&ctr, nk * 4));
        auto ship = [&](const mat &m) { ship_launch(m, s); };
        for (int rep = 0; rep < 3; rep++) {
            float ms = time_graph([&] { graph4(ship); }, 20);
            CKE(cudaGetLastError());
            printf("graph4 shipped (PDL waits)   %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", ms, 1000 / ms,
                   bytes / (ms * 1e-3) / 4.8e12 * 100);
            { /* qforge's norm itself (x 4096 floats, its weights, the f32 row and the q8_0 activation) */
                float *gb, *ob; int8_t *qb;
                CKE(cudaMalloc(&gb, 4096 * 4)); CKE(cudaMalloc(&ob, 4096 * 4)); CKE(cudaMalloc(&qb, 4096 + 128 * 8));
                { /* the norm's weights: around 1, as a model's */
                    std::vector<float> g1(4096);
                    for (int e = 0; e < 4096; e++) g1[e] = 0.5f + (float)(e % 7) * 0.1f;
                    CKE(cudaMemcpy(gb, g1.data(), 4096 * 4, cudaMemcpyHostToDevice));
                }
                float eps = 1e-5f; __half *o16 = nullptr;
                for (int fresh = 0; fresh < 5; fresh++) { /* x: a row no kernel of the step writes, or the matvec's output;
                                                            2: no q8_0 activation, 3: no f32 row, 4: neither */
                    float *xs_ = fresh == 1 ? y : yt, *ob_ = fresh >= 3 ? nullptr : ob;
                    int8_t *qb_ = fresh == 2 || fresh == 4 ? nullptr : qb;
                    float me = time_graph([&] {
                        void *ta[] = {&xs_, (void *)&gb, (void *)&D, &eps, (void *)&ob_, (void *)&o16, (void *)&qb_};
                        auto t = [&]() { launch((const void *)k_rmsnorm4<4>, 1, 256, ta, s); };
                        graph4w(ship, t); }, 20);
                    CKE(cudaGetLastError());
                    const char *nm[5] = {"", " (x: the matvec's output)", " without the q8_0 activation", " without the f32 row",
                                         " without either"};
                    printf("graph4 one-block kernels qforge's norm%s %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n",
                           nm[fresh], me, 1000 / me, bytes / (me * 1e-3) / 4.8e12 * 100);
                }
                cudaFree(gb), cudaFree(ob), cudaFree(qb);
            }
            for (int e = 0; e < 2; e++) { /* a norm's shape: 256 threads x 4 float4, 1024 x 1 */
                float me = time_graph([&] {
                    void *ta[] = {&yt, (void *)&D};
                    auto t = [&]() {
                        if (!e) launch((const void *)k_tiny_n<4>, 1, 256, ta, s);
                        else launch((const void *)k_tiny_n<1>, 1, 1024, ta, s);
                    };
                    graph4w(ship, t); }, 20);
                CKE(cudaGetLastError());
                printf("graph4 one-block kernels as a norm %s %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n",
                       e ? "1024 x 1" : "256 x 4 ", me, 1000 / me, bytes / (me * 1e-3) / 4.8e12 * 100);
            }
            for (int e = 0; e < 2; e++) { /* the one-block kernels empty (e 0), or left out (e 1) */
                float me = time_graph([&] {
                    void *ta[] = {&yt, (void *)&D};
                    auto t = [&]() { if (!e) launch((const void *)k_tiny_e, 1, 256, ta, s); };
                    graph4w(ship, t); }, 20);
                CKE(cudaGetLastError());
                printf("graph4 one-block kernels %s %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", e ? "left out" : "empty   ",
                       me, 1000 / me, bytes / (me * 1e-3) / 4.8e12 * 100);
            }
            for (int tt = 0; tt < 2; tt++)
                for (int ns : {0, 20, 64, 200}) {
                    float mh = time_graph([&] {
                        CKE(cudaMemsetAsync(ctr, 0, nk * 4, s));
                        int k = 0;
                        const unsigned *prev = nullptr; /* the flag of the kernel just launched, if one-block */
                        auto tiny = [&]() {
                            const unsigned *wc = tt ? prev : nullptr; /* tt 0: tiny after tiny waits by PDL */
                            unsigned *sc = ctr + k++;
                            void *a[] = {&yt, (void *)&D, (void *)&wc, (void *)&sc, &ns};
                            launch((const void *)k_tiny_h, 1, 256, a, s);
                            prev = sc;
                        };
                        auto mv = [&](const mat &m) {
                            if (!prev) { ship_launch(m, s); return; }
                            const uint8_t *w = m.w; size_t rb = m.rb; int K = m.K, N = m.N;
                            const unsigned *wc = prev;
                            void *a[] = {(void *)&w, &rb, &K, &N, (void *)&xq, (void *)&xd, (void *)&xs, &y, (void *)&wc, &ns};
                            if (K >= 8192) launch((const void *)k_q4h<2, 2, 2, 2>, (N + 3) / 4, 128, a, s);
                            else launch((const void *)k_q4h<4, 2, 2, 2>, (N + 7) / 8, 128, a, s);
                            prev = nullptr;
                        };
                        graph4w(mv, tiny); }, 20);
                    CKE(cudaGetLastError());
                    printf("graph4 flags after 1-block%s ns %3d  %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n",
                           tt ? " (+tiny)" : "        ", ns, mh, 1000 / mh, bytes / (mh * 1e-3) / 4.8e12 * 100);
                }
        }
        return 0;
    }

    // cpa (third argument): the graph4 step, shipped kernels (registers) against k_q4c (shared
    // memory by cp.async, the block's whole slice before the wait); outputs compared first
    if (!F16 && argc > 3 && !strcmp(argv[3], "cpa")) {
        g_pdl = true;
        auto cpa_launch = [&](const mat &m, int R4, cudaStream_t st) {
            const uint8_t *w = m.w; size_t rb = m.rb; int K = m.K, N = m.N;
            void *b[] = {(void *)&w, &rb, &K, &N, (void *)&xq, (void *)&xd, (void *)&xs, &y};
            if (K >= 8192) // NBL 7 (K 14336): 2 rows a group
                launch((const void *)k_q4c<2, 7, 2, 2>, (N + 3) / 4, 128, b, st, (size_t)2 * 7 * 128 * 16);
            else
                launch(R4 == 4 ? (const void *)k_q4c<4, 2, 2, 2> : R4 == 2 ? (const void *)k_q4c<2, 2, 2, 2> : (const void *)k_q4c<8, 2, 2, 2>,
                       (N + 2 * R4 - 1) / (2 * R4), 128, b, st, (size_t)R4 * 2 * 128 * 16);
        };
        { // the outputs of both, each shape
            std::vector<float> a(V), b(V);
            const mat *ms[5] = {&qkv[0], &wo[0], &gu[0], &dn[0], &lm};
            for (int i = 0; i < 5; i++)
                for (int R : {2, 4, 8}) {
                    ship_launch(*ms[i], s);
                    CKE(cudaMemcpyAsync(a.data(), y, ms[i]->N * 4, cudaMemcpyDeviceToHost, s));
                    CKE(cudaMemsetAsync(y, 0, ms[i]->N * 4, s));
                    cpa_launch(*ms[i], R, s);
                    CKE(cudaMemcpyAsync(b.data(), y, ms[i]->N * 4, cudaMemcpyDeviceToHost, s));
                    CKE(cudaStreamSynchronize(s));
                    double num = 0, den = 0;
                    for (int r = 0; r < ms[i]->N; r++) num += (double)(a[r] - b[r]) * (a[r] - b[r]), den += (double)a[r] * a[r];
                    if (!(num <= 1e-10 * den)) printf("MISMATCH cpa R%d shape %d: nmse %g\n", R, i, num / den);
                }
            printf("cpa check done\n");
        }
        for (int i = 0; i < 5; i++) { // each shape alone, 32 matrices chained
            const char *nm[5] = {"qkv", "wo", "gu", "down", "lm"};
            for (int k = 0; k < 3; k++) {
                float ms = time_graph([&] {
                    for (int l = 0; l < L; l++) {
                        const mat &m = i == 0 ? qkv[l] : i == 1 ? wo[l] : i == 2 ? gu[l] : i == 3 ? dn[l] : lm;
                        if (k == 0) ship_launch(m, s); else cpa_launch(m, k == 1 ? 4 : 2, s);
                    } }, 10);
                const mat &m = i == 0 ? qkv[0] : i == 1 ? wo[0] : i == 2 ? gu[0] : i == 3 ? dn[0] : lm;
                printf("shape %-5s %-10s %8.2f us  %5.2f TB/s\n", nm[i], k == 0 ? "shipped" : k == 1 ? "cpa R4" : "cpa R2", ms * 1000 / L,
                       m.rb * m.N / (ms / L * 1e-3) / 1e12);
            }
        }
        for (int rep = 0; rep < 3; rep++)
            for (int k = 0; k < 4; k++) { // 0 shipped, 1 cpa R4 (down R2 NBL7), 2 cpa R2, 3 cpa only down / gu
                float ms = time_graph([&] {
                    auto mv = [&](const mat &m, bool big) {
                        if (k == 0 || (k == 3 && !big)) ship_launch(m, s);
                        else cpa_launch(m, k == 2 ? 2 : 4, s);
                    };
                    graph4([&](const mat &m) { mv(m, m.N == 2 * F || m.K == F); }); }, 20); // big: gate|up, down
                CKE(cudaGetLastError());
                const char *nm[4] = {"shipped", "cpa R4", "cpa R2", "cpa gu+down"};
                printf("graph4 %-12s %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", nm[k], ms, 1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
            }
        return 0;
    }

    // l2pf (third argument): the graph4 step against the same step with the paced L2 prefetcher
    // forked beside it (W MB ahead, B blocks of one warp, chunks of CH KB; line or bulk prefetches)
    if (!F16 && argc > 3 && !strcmp(argv[3], "l2pf")) {
        g_pdl = true;
        std::vector<pseg> segs;
        unsigned long long off = 0;
        auto addseg = [&](const mat &m) { segs.push_back({m.w, (unsigned long long)m.rb * m.N, off}); off += (unsigned long long)m.rb * m.N; };
        for (int l = 0; l < L; l++) addseg(qkv[l]), addseg(wo[l]), addseg(gu[l]), addseg(dn[l]);
        addseg(lm);
        pseg *dsg; unsigned *prog;
        CKE(cudaMalloc(&dsg, segs.size() * sizeof(pseg)));
        CKE(cudaMemcpy(dsg, segs.data(), segs.size() * sizeof(pseg), cudaMemcpyHostToDevice));
        CKE(cudaMalloc(&prog, 4)); CKE(cudaMemset(prog, 0, 4));
        const int nseg = (int)segs.size();
        cudaStream_t s2; CKE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        cudaEvent_t ef, ej; CKE(cudaEventCreateWithFlags(&ef, cudaEventDisableTiming)); CKE(cudaEventCreateWithFlags(&ej, cudaEventDisableTiming));
        struct lcase { int wmb, nb, chkb, mode, early, sig; };
        // wmb < 0: no prefetcher (sig: the matvecs still store their index)
        const lcase cs[] = {{-1, 0, 0, 0, 0, 0}, {-1, 0, 0, 0, 0, 1}, {8, 16, 256, 0, 0, 1}, {16, 16, 256, 0, 0, 1},
                            {24, 16, 256, 0, 0, 1}, {32, 16, 256, 0, 0, 1}, {16, 64, 128, 0, 0, 1}, {24, 64, 128, 0, 0, 1},
                            {16, 16, 256, 1, 0, 1}, {24, 16, 256, 1, 0, 1}, {24, 132, 64, 1, 0, 1}, {24, 16, 256, 0, 1, 1},
                            {40, 16, 256, 0, 0, 1}, {-1, 0, 0, 0, 0, 0}};
        for (int rep = 0; rep < 2; rep++)
            for (const lcase &c : cs) {
                float ms = time_graph([&] {
                    if (c.wmb >= 0) {
                        CKE(cudaMemsetAsync(prog, 0, 4, s));
                        CKE(cudaEventRecord(ef, s));
                        CKE(cudaStreamWaitEvent(s2, ef, 0));
                        unsigned long long Wb = (unsigned long long)c.wmb << 20;
                        unsigned CH = (unsigned)c.chkb << 10;
                        int md = c.mode;
                        void *pa[] = {(void *)&dsg, (void *)&nseg, (void *)&prog, &Wb, &CH, &md};
                        CKE(cudaLaunchKernel((const void *)k_l2pf, dim3(c.nb), dim3(32), pa, 0, s2));
                    }
                    unsigned idx = 0;
                    auto mv = [&](const mat &m) {
                        const uint8_t *w = m.w; size_t rb = m.rb; int K = m.K, N = m.N;
                        int early = c.early;
                        void *a[] = {(void *)&w, &rb, &K, &N, (void *)&xq, (void *)&xd, (void *)&xs, &y, (void *)&prog, &idx, &early};
                        if (!c.sig) ship_launch(m, s);
                        else if (K >= 8192) launch((const void *)k_q4s<2, 2, 2, 2, 2>, (N + 3) / 4, 128, a, s);
                        else launch((const void *)k_q4s<4, 2, 2, 2, 2>, (N + 7) / 8, 128, a, s);
                        idx++;
                    };
                    graph4(mv);
                    if (c.wmb >= 0) {
                        CKE(cudaEventRecord(ej, s2));
                        CKE(cudaStreamWaitEvent(s, ej, 0));
                    } }, 20);
                CKE(cudaGetLastError());
                if (c.wmb < 0) printf("l2pf none%s                                   %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n",
                                      c.sig ? " (signals)" : "          ", ms, 1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
                else printf("l2pf W %2d MB blocks %3d chunk %3d KB %s %s %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", c.wmb, c.nb, c.chkb,
                            c.mode ? "bulk" : "line", c.early ? "early" : "after", ms, 1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
            }
        return 0;
    }
    printf("per-shape: us per matvec (32 distinct matrices in a chain) and TB/s\n%-20s", "variant");
    for (int i = 0; i < 5; i++) printf(" %22s", shn[i]);
    printf("\n%-20s", "read ceiling");
    for (int i = 0; i < 5; i++) {
        float ms = time_graph([&] {
            for (int l = 0; l < L; l++) {
                const mat &m = i == 0 ? qkv[l] : i == 1 ? wo[l] : i == 2 ? gu[l] : i == 3 ? dn[l] : lm;
                const uint4 *p = (const uint4 *)m.w; size_t n16 = m.rb * m.N / 16;
                void *args[] = {(void *)&p, &n16, &y};
                launch((const void *)k_read, 132 * 8, 256, args, s);
            } }, 10);
        const mat &m = i == 0 ? qkv[0] : i == 1 ? wo[0] : i == 2 ? gu[0] : i == 3 ? dn[0] : lm;
        printf(" %10.2f %5.2fTB/s  ", ms * 1000 / L, m.rb * m.N / (ms / L * 1e-3) / 1e12);
    }
    printf("\n");
    for (auto &v : vs) {
        printf("%-20s", v.name);
        for (int i = 0; i < 5; i++) {
            float ms = time_graph([&] {
                for (int l = 0; l < L; l++) {
                    const mat &m = i == 0 ? qkv[l] : i == 1 ? wo[l] : i == 2 ? gu[l] : i == 3 ? dn[l] : lm;
                    run_mv(v, m, xq, xd, xs, y, s);
                } }, 10);
            const mat &m = i == 0 ? qkv[0] : i == 1 ? wo[0] : i == 2 ? gu[0] : i == 3 ? dn[0] : lm;
            printf(" %10.2f %5.2fTB/s  ", ms * 1000 / L, m.rb * m.N / (ms / L * 1e-3) / 1e12);
        }
        printf("\n");
        CKE(cudaGetLastError());
    }
    // 2) the whole step's matvecs (32 layers x 4 + lm head), optionally with `tiny` 1-block kernels per layer
    for (int pdl = 1; pdl >= 1; pdl--) {
        g_pdl = pdl;
        for (auto &v : vs) {
            float ms = time_graph([&] {
                for (int l = 0; l < L; l++) {
                    for (int t = 0; t < tiny / 2; t++) { void *a[] = {&yt, (void *)&D}; launch((const void *)k_tiny, 1, 256, a, s); }
                    run_mv(v, qkv[l], xq, xd, xs, y, s);
                    run_mv(v, wo[l], xq, xd, xs, y, s);
                    for (int t = 0; t < tiny - tiny / 2; t++) { void *a[] = {&yt, (void *)&D}; launch((const void *)k_tiny, 1, 256, a, s); }
                    run_mv(v, gu[l], xq, xd, xs, y, s);
                    run_mv(v, dn[l], xq, xd, xs, y, s);
                }
                run_mv(v, lm, xq, xd, xs, y, s); }, 20);
            printf("step pdl %d tiny %d %-20s %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", pdl, tiny, v.name, ms, 1000 / ms,
                   bytes / (ms * 1e-3) / 4.8e12 * 100);
        }
    }
    // 2c) the step as qforge's graph now (docs/gpu.md "Session 21"): norm, q|k|v, split-K
    //     attention, merge, o, norm, gate|up, down: 4 one-block kernels a layer, every variant
    if (!F16) {
        g_pdl = true;
        for (int rep = 0; rep < 2; rep++)
            for (auto &v : vs) {
                float ms = time_graph([&] { graph4([&](const mat &m) { run_mv(v, m, xq, xd, xs, y, s); }); }, 20);
                CKE(cudaGetLastError());
                printf("graph4 %-20s %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", v.name, ms, 1000 / ms,
                       bytes / (ms * 1e-3) / 4.8e12 * 100);
            }
    }
    // 2d) the same graph4 step with flags between the kernels instead of griddepcontrol.wait
    //     (still launched with PDL, so each kernel is resident before its predecessor ends)
    if (!F16) {
        g_pdl = true;
        unsigned *ctr;
        const int nk = L * 8 + 1;
        CKE(cudaMalloc(&ctr, nk * 4));
        for (int rep = 0; rep < 2; rep++)
            for (int ns : {0, 32, 100, 400}) {
                for (int kind = 0; kind < 2; kind++) { // 0: R4U2W2P2 all (K>=8192: R2); 1: same as shipped
                    float ms = time_graph([&] {
                        CKE(cudaMemsetAsync(ctr, 0, nk * 4, s));
                        int k = 0;
                        unsigned prevb = 0;
                        auto tiny = [&]() {
                            const unsigned *wc = k ? ctr + k - 1 : nullptr;
                            unsigned *sc = ctr + k;
                            void *a[] = {&yt, (void *)&D, (void *)&wc, &prevb, (void *)&sc, &ns};
                            launch((const void *)k_tiny_f, 1, 128, a, s);
                            prevb = 1, k++;
                        };
                        auto mv = [&](const mat &m) {
                            const uint8_t *w = m.w; size_t rb = m.rb; int K = m.K, N = m.N;
                            const unsigned *wc = k ? ctr + k - 1 : nullptr;
                            unsigned *sc = ctr + k;
                            void *a[] = {(void *)&w, &rb, &K, &N, (void *)&xq, (void *)&xd, (void *)&xs, &y, (void *)&wc, &prevb, (void *)&sc, &ns};
                            unsigned nb;
                            if (K >= 8192 && kind == 1) nb = (N + 3) / 4, launch((const void *)k_q4f<2, 2, 2, 2>, nb, 128, a, s);
                            else nb = (N + 7) / 8, launch((const void *)k_q4f<4, 2, 2, 2>, nb, 128, a, s);
                            prevb = nb, k++;
                        };
                        graph4w(mv, tiny); }, 20);
                    CKE(cudaGetLastError());
                    printf("flags ns %3d %s %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", ns, kind ? "shipped  " : "R4 all   ", ms,
                           1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
                }
            }
    }
    if (bulk_only) return 0;
    // 2b) the step laid out as qforge's decode graph: norm, q|k|v, split / attention / merge /
    //     quant, o, norm, gate|up, quant, down (7 small kernels a layer), the split (first small
    //     kernel after q|k|v) also asking L2 for the first PF MB of this layer's gate|up, and the
    //     quant after gate|up for the first PD MB of down
    if (!F16 && (argc <= 3 || strcmp(argv[3], "nopf"))) {
        g_pdl = true;
        variant v = {"ef R4U2 W2P2", k_q4x<4, 2, 2, 2, 2>, 8, 128};
        auto tiny1 = [&](const uint8_t *pf, size_t bytes, int el, unsigned nb) {
            void *a[] = {&yt, (void *)&D, (void *)&pf, &bytes};
            const void *f = el == 0 ? (const void *)k_tiny_pf<0> : el == 1 ? (const void *)k_tiny_pf<1>
                          : el == 2 ? (const void *)k_tiny_pf<2> : (const void *)k_tiny_pf<3>;
            launch(f, nb, 256, a, s);
        };
        struct pcase { int pf, pd, el; unsigned nb; };
        // el: 0 bulk, 1 bulk evict_last, 2 line prefetch, 3 line prefetch evict_last
        const pcase cs[] = {{0, 0, 0, 1},    {0, 0, 0, 132},  {8, 0, 0, 132},  {16, 0, 0, 132}, {32, 0, 0, 132},
                            {16, 0, 0, 264}, {32, 0, 0, 528}, {16, 0, 1, 132}, {32, 0, 1, 264}, {8, 0, 2, 132},
                            {16, 0, 2, 132}, {32, 0, 2, 132}, {16, 0, 3, 132}, {32, 0, 3, 264}, {24, 8, 2, 132},
                            {0, 0, 0, 1}};
        for (const pcase &c : cs) {
            float ms = time_graph([&] {
                for (int l = 0; l < L; l++) {
                    tiny1(nullptr, 0, false, 1);
                    run_mv(v, qkv[l], xq, xd, xs, y, s);
                    tiny1(gu[l].w, (size_t)c.pf << 20, c.el, c.nb);
                    for (int t = 0; t < 3; t++) tiny1(nullptr, 0, false, 1);
                    run_mv(v, wo[l], xq, xd, xs, y, s);
                    tiny1(nullptr, 0, false, 1);
                    run_mv(v, gu[l], xq, xd, xs, y, s);
                    tiny1(dn[l].w, (size_t)c.pd << 20, c.el, 1);
                    run_mv(v, dn[l], xq, xd, xs, y, s);
                }
                run_mv(v, lm, xq, xd, xs, y, s); }, 20);
            CKE(cudaGetLastError());
            printf("layout pf gate|up %2d MB down %d MB %s blocks %u: %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", c.pf, c.pd,
                   c.el == 0 ? "bulk      " : c.el == 1 ? "bulk el   " : c.el == 2 ? "line      " : "line el   ", c.nb, ms, 1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
        }
    }
    // 3) persistent: the same step as one kernel with grid barriers (tiny phases run by block 0)
    if (!F16) {
        std::vector<phase> hp;
        for (int l = 0; l < L; l++) {
            for (int t = 0; t < tiny / 2; t++) hp.push_back({nullptr, 0, 0, 0, D});
            hp.push_back({qkv[l].w, qkv[l].rb, qkv[l].K, qkv[l].N, 0});
            hp.push_back({wo[l].w, wo[l].rb, wo[l].K, wo[l].N, 0});
            for (int t = 0; t < tiny - tiny / 2; t++) hp.push_back({nullptr, 0, 0, 0, D});
            hp.push_back({gu[l].w, gu[l].rb, gu[l].K, gu[l].N, 0});
            hp.push_back({dn[l].w, dn[l].rb, dn[l].K, dn[l].N, 0});
        }
        hp.push_back({lm.w, lm.rb, lm.K, lm.N, 0});
        phase *dph; unsigned *bar;
        CKE(cudaMalloc(&dph, hp.size() * sizeof(phase))); CKE(cudaMemcpy(dph, hp.data(), hp.size() * sizeof(phase), cudaMemcpyHostToDevice));
        CKE(cudaMalloc(&bar, 8)); CKE(cudaMemset(bar, 0, 8));
        int nph = (int)hp.size(), nsm = 0; cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
        auto runp = [&](const char *name, auto kern, int bps) {
            int occ = 0; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 128, 0);
            const int nbk = nsm * (bps < occ ? bps : occ);
            float ms = time_graph([&] { kern<<<nbk, 128, 0, s>>>(dph, nph, xq, xd, xs, y, yt, bar); }, 20);
            CKE(cudaGetLastError());
            printf("persist tiny %d %-14s blocks %4d (occ %d) %.3f ms  %.1f tok/s  %.1f%% of 4.8 TB/s bound\n", tiny, name, nbk, occ, ms,
                   1000 / ms, bytes / (ms * 1e-3) / 4.8e12 * 100);
        };
        for (int bps : {2, 4, 99}) { // 99: as many as fit
            runp("R4U2W2P2", k_persist<4, 2, 2, 2, 0>, bps);
            runp("R4U2W2P2 pf2", k_persist<4, 2, 2, 2, 2>, bps);
        }
    }
    return 0;
}
