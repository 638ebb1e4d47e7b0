/* cuda_score.cu: PPL scoring on the device. */
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

/* ---- the sampler's reduction of one row of logits (launch_topk). Each k_topk_blocks block of
 * TK_E logits turns them into 64-bit composites (tk_key below, the complement of the id below
 * it: a larger composite is a larger logit, or the same one at a lower id; 0 for a non-finite
 * logit), takes their max (the first argmax), its non-finite count and its sum of expf((l -
 * m_b) / temp) about its own max m_b, and sorts them (bitonic, in shared memory) to hand its P
 * largest on (P: k rounded up to a power of two). While more than TK_FINAL_MAX candidates are
 * left, k_topk_merge blocks sort TK_M of them at a time and hand their P largest on again (rows
 * over 262 144 logits at k 256). One k_topk_final block then combines the maxima and counts,
 * rescales each block's sum to the row's max (exp((m_b - max) / temp) in double) and sorts the
 * candidates left for the k largest. ---- */
__device__ static inline unsigned tk_key(float f) { /* ascending with f, for finite f; -0 is +0 */
    const unsigned b = f == 0.0f ? 0u : __float_as_uint(f);
    return b ^ ((b >> 31) ? 0xFFFFFFFFu : 0x80000000u);
}
#define TK_E 4096
#define TK_FINAL_MAX 16384 /* candidates the combining block sorts (128 KB of shared memory) */
#define TK_M 4096          /* candidates a merging block sorts (32 KB) */
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
/* the groups of TK_M candidates in[0, n) (whole lists of P, padded with 0): each block's P largest,
 * sorted, to outc[block * P ..] */
__global__ void __launch_bounds__(1024) k_topk_merge(const unsigned long long *__restrict__ in, int n, int P,
                                                     unsigned long long *outc) {
    __shared__ unsigned long long s[TK_M];
    const int base = blockIdx.x * TK_M;
    for (int j = threadIdx.x; j < TK_M; j += 1024) s[j] = base + j < n ? in[base + j] : 0ull;
    __syncthreads();
    tk_bitonic_desc(s, TK_M);
    for (int j = threadIdx.x; j < P; j += 1024) outc[(size_t)blockIdx.x * P + j] = s[j];
}
/* the row's reduction from the nb blocks' parts and the nc candidates left in cand (n2: nc
 * rounded up to a power of two, the shared memory's composites) */
__global__ void __launch_bounds__(1024) k_topk_final(const float *__restrict__ l, int V, int nb, float temp, int nc, int n2,
                                                     int k, const tk_part *part, const unsigned long long *cand,
                                                     qf_gpu_topk *out) {
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
        for (int j = t; j < n2; j += 1024) sc[j] = j < nc ? cand[j] : 0ull;
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
/* the merge levels' second buffer, in composites: the first level's output for nb lists of P */
static size_t topk_merge_slots(size_t nb) { return (nb * QF_GPU_TOPK_MAX + TK_M - 1) / TK_M * QF_GPU_TOPK_MAX; }
size_t topk_scratch_bytes(int V) {
    const size_t nb = ((size_t)V + TK_E - 1) / TK_E;
    return nb * (sizeof(tk_part) + QF_GPU_TOPK_MAX * sizeof(unsigned long long)) +
           topk_merge_slots(nb) * sizeof(unsigned long long);
}
void launch_topk(const float *logits, int V, float temp, int k, qf_gpu_topk *out, void *scratch, cudaStream_t s) {
    const int nb = (V + TK_E - 1) / TK_E, P = topk_per_block(temp, k);
    tk_part *part = (tk_part *)scratch;
    unsigned long long *cand = (unsigned long long *)(part + nb), *next = cand + (size_t)nb * QF_GPU_TOPK_MAX;
    k_topk_blocks<<<nb, 1024, 0, s>>>(logits, V, temp, P, part, cand);
    int nc = nb * P; /* each level takes TK_M / P lists to one: 16 to 1 and more */
    while (nc > TK_FINAL_MAX) {
        const int m = (nc + TK_M - 1) / TK_M;
        k_topk_merge<<<m, 1024, 0, s>>>(cand, nc, P, next);
        unsigned long long *t = cand;
        cand = next, next = t, nc = m * P;
    }
    int n2 = 1;
    while (n2 < nc) n2 <<= 1;
    if (P && n2 * 8 > 48 * 1024) /* above the default: asked for on this call's device (k 128 and up at 128k logits) */
        cudaFuncSetAttribute(k_topk_final, cudaFuncAttributeMaxDynamicSharedMemorySize, n2 * 8);
    k_topk_final<<<1, 1024, P ? (size_t)n2 * 8 : 0, s>>>(logits, V, nb, temp, nc, n2, k, part, cand, out);
}
