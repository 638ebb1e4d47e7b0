/* cuda_score.cu: PPL scoring on the device. */
#include <limits.h>

#include "kernels/cuda/cuda_common.cuh"

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


void launch_nll(const float *logits, int n_rows, int V, const int32_t *tgt, double *nll, cudaStream_t s) {
    k_nll<<<n_rows, 1024, 0, s>>>(logits, V, tgt, nll);
}

/* ---- the sampler's reduction of one row of logits (launch_topk): one block of TK_T threads.
 * Pass 1: the largest finite logit, the non-finite count and (k > 0) a histogram of the top
 * TK_B0 bits of each finite logit's order-preserving key; pass 2: the sum of expf((l - max) /
 * temp) in double (the host sampler's formula), the first index of the max, the next digit's
 * histogram; pass 3 the last digit's: after each histogram one warp finds the digit that holds
 * the k-th largest key, so after pass 3 the k-th largest key T and how many of the keys equal
 * to T are needed are known. Pass 4 collects the keys above T and the needed ones equal to T
 * (in index order when more are equal than needed: one warp scans, rare). Histogram adds are
 * aggregated over the lanes of a warp that share a bin (__match_any_sync): logits crowd into a
 * few bins of the top digits. */
#define TK_T 1024
#define TK_BINS 2048 /* digits of 11, 11 and 10 bits */
__device__ static inline unsigned tk_key(float f) { /* ascending with f, for finite f; -0 is +0 */
    const unsigned b = f == 0.0f ? 0u : __float_as_uint(f);
    return b ^ ((b >> 31) ? 0xFFFFFFFFu : 0x80000000u);
}
/* the digit of round r (0, 1, 2) and the key bits above it */
__device__ static inline int tk_shift(int r) { return r == 0 ? 21 : r == 1 ? 10 : 0; }
__device__ static inline unsigned tk_dmask(int r) { return r == 2 ? 0x3FFu : 0x7FFu; }
/* add bin (or nothing: bin < 0) for each lane of the warp; every lane calls it */
__device__ static inline void tk_hist_add(unsigned *hist, int bin) {
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    if (bin >= 0 && (threadIdx.x % 32) == (unsigned)(__ffs(peers) - 1)) atomicAdd(&hist[bin], (unsigned)__popc(peers));
}
/* warp 0: the digit d of the histogram where the need-th largest key lies (counting from the
 * top); *need becomes its rank among the keys of digit d, *prefix gains d */
__device__ static void tk_pick(const unsigned *hist, int r, unsigned *prefix, unsigned *need) {
    const int lane = threadIdx.x % 32, nb = (int)tk_dmask(r) + 1, per = nb / 32;
    unsigned c = 0;
    for (int j = 0; j < per; j++) c += hist[lane * per + j];
    unsigned above = 0; /* keys in the lanes above this one */
    unsigned incl = c;  /* this lane and above: suffix sum */
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_down_sync(0xffffffffu, incl, o);
        if (lane + o < 32) incl += v;
    }
    above = incl - c;
    const unsigned nd = *need;
    const unsigned hit = __ballot_sync(0xffffffffu, above < nd && nd <= incl);
    if (lane == __ffs(hit) - 1) {
        unsigned acc = above;
        for (int j = per - 1; j >= 0; j--) {
            const unsigned h = hist[lane * per + j];
            if (acc + h >= nd) {
                *need = nd - acc;
                *prefix |= (unsigned)(lane * per + j) << tk_shift(r);
                break;
            }
            acc += h;
        }
    }
}
__global__ void __launch_bounds__(TK_T) k_topk(const float *__restrict__ l, int V, float temp, int k, qf_gpu_topk *out) {
    __shared__ unsigned hist[TK_BINS];
    __shared__ float smx[32];
    __shared__ int snf[32];
    __shared__ double ssum[32];
    __shared__ int s_arg, s_cnt;
    __shared__ unsigned s_prefix, s_need;
    const int t = threadIdx.x, lane = t % 32, w = t / 32;
    const bool sel = temp > 0.0f && k > 0;
    for (int i = t; i < TK_BINS; i += TK_T) hist[i] = 0;
    if (t == 0) s_arg = INT_MAX, s_cnt = 0, s_prefix = 0;
    __syncthreads();
    /* pass 1 */
    float mx = -INFINITY;
    int nf = 0;
    for (int base = 0; base < V; base += TK_T) {
        const int i = base + t;
        const float v = i < V ? l[i] : 0.0f;
        const bool fin = i < V && isfinite(v);
        nf += i < V && !fin;
        if (fin) mx = fmaxf(mx, v);
        if (sel) tk_hist_add(hist, fin ? (int)(tk_key(v) >> 21) : -1);
    }
    for (int o = 16; o > 0; o >>= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        nf += __shfl_xor_sync(0xffffffffu, nf, o);
    }
    if (lane == 0) smx[w] = mx, snf[w] = nf;
    __syncthreads();
    mx = smx[0], nf = snf[0];
    for (int j = 1; j < TK_T / 32; j++) mx = fmaxf(mx, smx[j]), nf += snf[j];
    const int nfin = V - nf, kk = sel ? min(k, nfin) : 0;
    if (w == 0 && kk > 0) {
        if (lane == 0) s_need = (unsigned)kk;
        __syncwarp();
        tk_pick(hist, 0, &s_prefix, &s_need);
    }
    __syncthreads();
    /* pass 2 */
    for (int i = t; i < TK_BINS; i += TK_T) hist[i] = 0;
    __syncthreads();
    double sum = 0.0;
    int arg = INT_MAX;
    for (int base = 0; base < V; base += TK_T) {
        const int i = base + t;
        const float v = i < V ? l[i] : 0.0f;
        const bool fin = i < V && isfinite(v);
        if (fin && v == mx && arg == INT_MAX) arg = i;
        if (fin && temp > 0.0f) sum += (double)expf((v - mx) / temp);
        if (kk > 0) {
            const unsigned key = tk_key(v);
            tk_hist_add(hist, fin && (key >> 21) == (s_prefix >> 21) ? (int)((key >> 10) & 0x7FFu) : -1);
        }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) ssum[w] = sum;
    if (arg != INT_MAX) atomicMin(&s_arg, arg);
    __syncthreads();
    if (w == 0 && kk > 0) tk_pick(hist, 1, &s_prefix, &s_need);
    __syncthreads();
    /* pass 3 */
    if (kk > 0) {
        for (int i = t; i < TK_BINS; i += TK_T) hist[i] = 0;
        __syncthreads();
        for (int base = 0; base < V; base += TK_T) {
            const int i = base + t;
            const float v = i < V ? l[i] : 0.0f;
            const bool fin = i < V && isfinite(v);
            const unsigned key = tk_key(v);
            tk_hist_add(hist, fin && (key >> 10) == (s_prefix >> 10) ? (int)(key & 0x3FFu) : -1);
        }
        __syncthreads();
        if (w == 0) tk_pick(hist, 2, &s_prefix, &s_need);
        __syncthreads();
    }
    /* pass 4: T = s_prefix; the keys above it, then s_need of those equal to it */
    const unsigned T = s_prefix, need = s_need;
    const unsigned n_eq = kk > 0 ? hist[T & 0x3FFu] : 0; /* keys equal to T (pass 3's bin) */
    if (kk > 0) {
        for (int base = 0; base < V; base += TK_T) {
            const int i = base + t;
            const float v = i < V ? l[i] : 0.0f;
            const bool fin = i < V && isfinite(v);
            const unsigned key = tk_key(v);
            const bool take = fin && (key > T || (key == T && n_eq == need));
            const unsigned m = __ballot_sync(0xffffffffu, take);
            int at = 0;
            if (lane == 0 && m) at = atomicAdd(&s_cnt, __popc(m));
            at = __shfl_sync(0xffffffffu, at, 0) + __popc(m & ((1u << lane) - 1));
            if (take) out->id[at] = i, out->logit[at] = v;
        }
        __syncthreads();
        if (n_eq != need && w == 0) { /* more equal keys than needed: the lowest ids, in order */
            int at = s_cnt, left = (int)need;
            for (int base = 0; base < V && left > 0; base += 32) {
                const int i = base + lane;
                const float v = i < V ? l[i] : 0.0f;
                const bool take = i < V && isfinite(v) && tk_key(v) == T;
                const unsigned m = __ballot_sync(0xffffffffu, take);
                const int r = __popc(m & ((1u << lane) - 1));
                if (take && r < left) out->id[at + r] = i, out->logit[at + r] = v;
                const int got = min(__popc(m), left);
                at += got, left -= got;
            }
        }
    }
    if (t == 0) {
        double s = 0.0;
        for (int j = 0; j < TK_T / 32; j++) s += ssum[j];
        out->lmax = s_arg == INT_MAX ? mx : l[s_arg]; /* the host's bits where the max is a signed zero */
        out->argmax = s_arg == INT_MAX ? 0 : s_arg;
        out->n_nonfinite = nf;
        out->n = kk;
        out->sum = s;
    }
}

/* ---- the same reduction over many blocks (launch_topk's route where its candidates fit): each
 * block of TK_E logits turns them into 64-bit composites (tk_key above, the complement of the id
 * below: a larger composite is a larger logit, or the same one at a lower id; 0 for a non-finite
 * logit), takes their max (the first argmax), its non-finite count and its sum of expf((l - m_b)
 * / temp) about its own max m_b, and sorts them (bitonic, in shared memory) to hand its P largest
 * on; one block then combines the maxima and counts, rescales each block's sum to the row's max
 * (exp((m_b - max) / temp) in double) and sorts the blocks' candidates for the k largest. ---- */
#define TK_E 4096
#define TK_FINAL_MAX 16384 /* candidates the combining block sorts (128 KB of shared memory) */
struct tk_part {
    unsigned long long maxc; /* the block's largest composite (0: no finite logit) */
    double sum;              /* sum of expf((l - m) / temp) over its finite logits */
    float m;                 /* its largest logit, as stored */
    int nf;                  /* its non-finite logits */
};
__device__ static inline unsigned long long tk_comp(float v, int i) {
    return isfinite(v) ? ((unsigned long long)tk_key(v) << 32) | (0xFFFFFFFFu - (unsigned)i) : 0ull;
}
__device__ static inline int tk_id(unsigned long long c) { return (int)(0xFFFFFFFFu - (unsigned)(c & 0xFFFFFFFFu)); }
/* s[0, n) sorted descending by all the block's threads (n a power of two) */
__device__ static void tk_bitonic_desc(unsigned long long *s, int n) {
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const unsigned long long a = s[lo], b = s[hi];
                if ((a < b) == ((lo & size) == 0)) s[lo] = b, s[hi] = a;
            }
            __syncthreads();
        }
}
/* the block's max composite and non-finite count, reduced over its 1024 threads (all call it) */
__device__ static void tk_block_max(unsigned long long *mc, int *nf, unsigned long long *sm, int *sn) {
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long x = __shfl_xor_sync(0xffffffffu, *mc, o);
        *mc = x > *mc ? x : *mc;
        *nf += __shfl_xor_sync(0xffffffffu, *nf, o);
    }
    if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = *mc, sn[threadIdx.x / 32] = *nf;
    __syncthreads();
    *mc = sm[0], *nf = sn[0];
    for (int j = 1; j < (int)blockDim.x / 32; j++) *mc = sm[j] > *mc ? sm[j] : *mc, *nf += sn[j];
}
__global__ void __launch_bounds__(1024) k_topk_blocks(const float *__restrict__ l, int V, float temp, int P, tk_part *part,
                                                      unsigned long long *cand) {
    __shared__ unsigned long long s[TK_E], sm[32];
    __shared__ int sn[32];
    __shared__ double ss[32];
    const int t = threadIdx.x, base = blockIdx.x * TK_E;
    float v[TK_E / 1024];
    unsigned long long mc = 0;
    int nf = 0;
#pragma unroll
    for (int j = 0; j < TK_E / 1024; j++) {
        const int i = base + t + 1024 * j;
        v[j] = i < V ? l[i] : 0.0f;
        const unsigned long long c = i < V ? tk_comp(v[j], i) : 0ull;
        nf += i < V && !isfinite(v[j]);
        mc = c > mc ? c : mc;
        if (P) s[t + 1024 * j] = c;
    }
    tk_block_max(&mc, &nf, sm, sn);
    const float m = mc ? l[tk_id(mc)] : -INFINITY;
    double sum = 0.0;
    if (temp > 0.0f) {
#pragma unroll
        for (int j = 0; j < TK_E / 1024; j++) {
            const int i = base + t + 1024 * j;
            if (i < V && isfinite(v[j])) sum += (double)expf((v[j] - m) / temp);
        }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (t % 32 == 0) ss[t / 32] = sum;
    }
    __syncthreads();
    if (P) {
        tk_bitonic_desc(s, TK_E);
        for (int j = t; j < P; j += 1024) cand[(size_t)blockIdx.x * P + j] = s[j];
    }
    if (t == 0) {
        sum = 0.0;
        if (temp > 0.0f)
            for (int j = 0; j < 32; j++) sum += ss[j];
        part[blockIdx.x] = {mc, sum, m, nf};
    }
}
__global__ void __launch_bounds__(1024) k_topk_final(const float *__restrict__ l, int V, int nb, float temp, int P, int k,
                                                     const tk_part *part, const unsigned long long *cand, qf_gpu_topk *out) {
    extern __shared__ unsigned long long sc[];
    __shared__ unsigned long long sm[32];
    __shared__ int sn[32];
    const int t = threadIdx.x;
    unsigned long long mc = 0;
    int nf = 0;
    for (int b = t; b < nb; b += 1024) mc = part[b].maxc > mc ? part[b].maxc : mc, nf += part[b].nf;
    tk_block_max(&mc, &nf, sm, sn);
    const int arg = mc ? tk_id(mc) : 0, nfin = V - nf;
    const float lmax = mc ? l[arg] : -INFINITY;
    const int kk = temp > 0.0f && k > 0 ? min(k, nfin) : 0;
    if (kk > 0) {
        int n2 = 1;
        while (n2 < nb * P) n2 <<= 1;
        for (int j = t; j < n2; j += 1024) sc[j] = j < nb * P ? cand[j] : 0ull;
        __syncthreads();
        tk_bitonic_desc(sc, n2);
        for (int j = t; j < kk; j += 1024) {
            const int id = tk_id(sc[j]);
            out->id[j] = id, out->logit[j] = l[id];
        }
    }
    if (t == 0) {
        double sum = 0.0;
        if (temp > 0.0f)
            for (int b = 0; b < nb; b++)
                if (part[b].maxc) sum += part[b].sum * exp(((double)part[b].m - (double)lmax) / (double)temp);
        out->lmax = lmax, out->argmax = arg, out->n_nonfinite = nf, out->n = kk, out->sum = sum;
    }
}

/* the many-block route's candidates a block hands on: k rounded up to a power of two (0: none) */
static int topk_per_block(float temp, int k) {
    if (!(temp > 0.0f) || k <= 0) return 0;
    int p = 1;
    while (p < k) p <<= 1;
    return p;
}
size_t topk_scratch_bytes(int V) {
    const size_t nb = ((size_t)V + TK_E - 1) / TK_E;
    return nb * (sizeof(tk_part) + QF_GPU_TOPK_MAX * sizeof(unsigned long long));
}
void launch_topk(const float *logits, int V, float temp, int k, qf_gpu_topk *out, void *scratch, cudaStream_t s) {
    const int nb = (V + TK_E - 1) / TK_E, P = topk_per_block(temp, k);
    if ((long long)nb * P > TK_FINAL_MAX || !scratch) { /* the one-block kernel: any V, slower */
        k_topk<<<1, TK_T, 0, s>>>(logits, V, temp, k, out);
        return;
    }
    tk_part *part = (tk_part *)scratch;
    unsigned long long *cand = (unsigned long long *)(part + nb);
    int n2 = 1;
    while (n2 < nb * P) n2 <<= 1;
    if (P && n2 * 8 > 48 * 1024) /* above the default: asked for on this call's device (k 128 and up at 128k logits) */
        cudaFuncSetAttribute(k_topk_final, cudaFuncAttributeMaxDynamicSharedMemorySize, n2 * 8);
    k_topk_blocks<<<nb, 1024, 0, s>>>(logits, V, temp, P, part, cand);
    k_topk_final<<<1, 1024, P ? (size_t)n2 * 8 : 0, s>>>(logits, V, nb, temp, P, k, part, cand, out);
}
