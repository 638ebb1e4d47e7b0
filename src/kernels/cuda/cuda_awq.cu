/* cuda_awq.cu: the AWQ learner's dense steps on the device (forge/learn_awq.c is the host side
 * and the oracle).
 *
 * Per group of linears sharing one input, the learner scores each candidate alpha by
 *   mse(alpha) = || X W^T - X Q(W*s)^T/s ||^2 / (n R)
 * (Q: the Q4_0 round trip with RTN, the diagonal-importance or the covariance block search) and
 * finally quantizes every folded weight with the block search. On the CPU those two steps are
 * 80% of an 8B-shaped run (the block search 62%, the sgemm 18%). Here:
 *   - k_awq_quant: one thread per (row, block of 32), the block's importance or 32x32 covariance
 *     in shared memory. Every f32 and f64 operation is rounded on its own (KV_MUL & co.: nvcc
 *     would contract a*b+c into an FMA) in the order learn_awq.c writes it, so the Q4_0 bytes, the
 *     d ratios and the dequantized Wq are bit-identical to the CPU's (test_cuda `op_awq_quant`).
 *   - the group's Y = X W^T and each Yq = X Wq^T: cublasSgemm (f32, not TF32);
 *   - the squared error: fixed-shape partial sums in double, added in a fixed order (the same
 *     result run to run; not the CPU's order, so the MSE differs from the host's in its last
 *     digits and an alpha can differ only where two candidates tie to ~1e-7). */
#include "kernels/cuda/cuda_common.cuh"

#define AWQ_RTN 0
#define AWQ_DIAG 1
#define AWQ_COV 2
#define AWQ_THREADS 128

/* clamp to [-8, 7] and round half up, as learn_awq.c's q4_level */
__device__ static inline int q4_level(float v) {
    v = v < -8.0f ? -8.0f : v > 7.0f ? 7.0f : v;
    return (int)KV_ADD(v, 8.5f) - 8;
}

/* y = H v, H 32 x 32 row-major (shared memory), sums in order */
__device__ static inline void mv32(const float *H, const float *v, float *y) {
    for (int i = 0; i < 32; i++) {
        float t = 0;
        for (int j = 0; j < 32; j++) t = KV_ADD(t, KV_MUL(H[i * 32 + j], v[j]));
        y[i] = t;
    }
}

/* the RTN block (quant.c's quant_q4_0): levels l and the f16 scale bits */
__device__ static inline void q4_rtn(const float *x, int8_t *l, uint16_t *dh) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), mx = x[j];
    const float d = KV_DIV(mx, -8.0f);
    const float id = d ? KV_DIV(1.0f, d) : 0.0f;
    *dh = f32_to_f16_bits(d);
    for (int j = 0; j < 32; j++) {
        int q = (int)KV_ADD(KV_MUL(x[j], id), 8.5f);
        l[j] = (int8_t)((q < 15 ? q : 15) - 8);
    }
}

/* sum_i imp_i (x_i - d l_i)^2 in f32 */
__device__ static inline double err_diag(const float *x, const float *imp, const int8_t *l, float d) {
    float e = 0;
    for (int i = 0; i < 32; i++) {
        const float r = KV_SUB(x[i], KV_MUL(d, (float)l[i]));
        e = KV_ADD(e, KV_MUL(KV_MUL(imp[i], r), r));
    }
    return (double)e;
}

/* t = the levels of x * scale, and the weighted sums sum imp x t, sum imp t^2 of their refit
 * (the product scale * x is commutative: the host's x * id is the same float) */
__device__ static inline void round_levels(const float *x, const float *imp, float scale, int8_t *t, float *slx,
                                           float *sl2) {
    float a = 0, b = 0;
    for (int i = 0; i < 32; i++) {
        const int v = q4_level(KV_MUL(scale, x[i]));
        t[i] = (int8_t)v;
        a = KV_ADD(a, KV_MUL(KV_MUL(imp[i], x[i]), (float)v));
        b = KV_ADD(b, KV_MUL(KV_MUL(imp[i], (float)v), (float)v));
    }
    *slx = a, *sl2 = b;
}

/* learn_awq.c's q4_block_search: levels / scale into l, dh (RTN when nothing beats it); returns
 * the chosen d over RTN's */
__device__ static float search_diag(const float *x, const float *imp, int8_t *l, uint16_t *dh) {
    int8_t t[32];
    q4_rtn(x, l, dh);
    const uint16_t dh_rtn = *dh;
    const float d_rtn = h2f_bits(dh_rtn);
    double best = 0;
    for (int i = 0; i < 32; i++) {
        const double r = KV_DSUB((double)x[i], (double)KV_MUL((float)l[i], d_rtn));
        best = KV_DADD(best, KV_DMUL(KV_DMUL((double)imp[i], r), r));
    }
    float amax = 0, mx = 0;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
    if (amax == 0 || d_rtn == 0) return 1;
    bool found = false;
    uint16_t best_dh = dh_rtn;
    for (int k = -9; k <= 9; k++) {
        const float iscale = KV_DIV(-KV_ADD(8.0f, KV_MUL(0.1f, (float)k)), mx);
        float slx, sl2;
        round_levels(x, imp, iscale, t, &slx, &sl2);
        if (!(sl2 > 0)) continue;
        for (int it = 0; it < 2; it++) {
            const uint16_t h = f32_to_f16_bits(KV_DIV(slx, sl2));
            const float d = h2f_bits(h);
            if (!(d != 0) || !isfinite(d)) break;
            const double e = err_diag(x, imp, t, d);
            if (e < best) {
                best = e;
                best_dh = h;
                for (int i = 0; i < 32; i++) l[i] = t[i];
                found = true;
            }
            round_levels(x, imp, KV_DIV(1.0f, d), t, &slx, &sl2); /* re-round with the refitted d */
            if (!(sl2 > 0)) break;
        }
    }
    if (!found) { /* l was only written with a better candidate: RTN again */
        q4_rtn(x, l, dh);
        return 1;
    }
    *dh = best_dh;
    return fabsf(KV_DIV(h2f_bits(best_dh), d_rtn));
}

/* (x - d l)^T H (x - d l) */
__device__ static double err_h(const float *x, const float *H, const int8_t *l, float d) {
    float e[32], he[32];
    for (int i = 0; i < 32; i++) e[i] = KV_SUB(x[i], KV_MUL(d, (float)l[i]));
    mv32(H, e, he);
    double t = 0;
    for (int i = 0; i < 32; i++) t = KV_DADD(t, KV_DMUL((double)e[i], (double)he[i]));
    return t;
}

/* least-squares d for l under H, rounded to f16 (0 when undefined) */
__device__ static float refit_h(const float *H, const float *hx, const int8_t *l) {
    float lf[32], hl[32];
    for (int i = 0; i < 32; i++) lf[i] = (float)l[i];
    mv32(H, lf, hl);
    double num = 0, den = 0;
    for (int i = 0; i < 32; i++) {
        num = KV_DADD(num, KV_DMUL((double)lf[i], (double)hx[i]));
        den = KV_DADD(den, KV_DMUL((double)lf[i], (double)hl[i]));
    }
    if (!(den > 0)) return 0;
    return h2f_bits(f32_to_f16_bits(__double2float_rn(__ddiv_rn(num, den))));
}

/* greedy rounding descent at fixed d */
__device__ static void descent_h(const float *x, const float *H, int8_t *l, float d) {
    float e[32], g[32];
    for (int i = 0; i < 32; i++) e[i] = KV_SUB(x[i], KV_MUL(d, (float)l[i]));
    mv32(H, e, g);
    const float dd = KV_MUL(d, d);
    for (int pass = 0; pass < 4; pass++) {
        bool moved = false;
        for (int i = 0; i < 32; i++) {
            const float hii = H[i * 32 + i];
            for (int dl = -1; dl <= 1; dl += 2) {
                const int nl = l[i] + dl;
                if (nl < -8 || nl > 7) continue;
                const float delta = KV_ADD(KV_MUL(KV_MUL(KV_MUL(-2.0f, d), (float)dl), g[i]), KV_MUL(dd, hii));
                if (delta < KV_MUL(-1e-12f, fabsf(KV_MUL(dd, hii)))) {
                    l[i] = (int8_t)nl;
                    const float step = KV_MUL(d, (float)dl);
                    for (int j = 0; j < 32; j++) g[j] = KV_SUB(g[j], KV_MUL(step, H[j * 32 + i]));
                    moved = true;
                    break;
                }
            }
        }
        if (!moved) break;
    }
}

/* learn_awq.c's q4_block_search_h */
__device__ static float search_cov(const float *x, const float *H, int8_t *l, uint16_t *dh) {
    int8_t bl[32];
    uint16_t h_rtn;
    q4_rtn(x, bl, &h_rtn);
    const float d_rtn = h2f_bits(h_rtn);
    double best = err_h(x, H, bl, d_rtn);
    float best_d = d_rtn;
    for (int i = 0; i < 32; i++) l[i] = bl[i];
    *dh = h_rtn;
    if (d_rtn == 0) return 1;
    float hx[32], dg[32];
    mv32(H, x, hx);
    bool found = false;
    for (int i = 0; i < 32; i++) dg[i] = H[i * 32 + i];
    uint16_t th;
    search_diag(x, dg, l, &th); /* l: the diagonal search's levels */
    float d = h2f_bits(th);
    if (d != 0 && isfinite(d)) {
        const double e = err_h(x, H, l, d);
        if (e < best) {
            best = e;
            best_d = d;
            for (int i = 0; i < 32; i++) bl[i] = l[i];
            found = true;
        }
    }
    for (int i = 0; i < 32; i++) l[i] = bl[i];
    d = best_d;
    for (int round = 0; round < 3; round++) {
        descent_h(x, H, l, d);
        const double e = err_h(x, H, l, d);
        if (e < best) {
            best = e;
            best_d = d;
            for (int i = 0; i < 32; i++) bl[i] = l[i];
            found = true;
        }
        const float d2 = refit_h(H, hx, l);
        if (!(d2 != 0) || !isfinite(d2) || d2 == d) break;
        const double e2 = err_h(x, H, l, d2);
        if (!(e2 < best)) break;
        best = e2;
        best_d = d = d2;
        for (int i = 0; i < 32; i++) bl[i] = l[i];
        found = true;
    }
    if (!found) {
        q4_rtn(x, l, dh);
        return 1;
    }
    for (int i = 0; i < 32; i++) l[i] = bl[i];
    *dh = f32_to_f16_bits(best_d);
    return fabsf(KV_DIV(best_d, d_rtn));
}

/* One thread per (row r, block b) of W [R][D]: x = W[r][block] * s (s NULL: 1), quantized by
 * `quant` (imp [D] for DIAG, cov [D/32][32][32] for COV). Writes any of: q4 [R][D/32] Q4_0
 * blocks, ratio [R][D/32] (d over RTN's), wq [R][D] = dequantized / s. Grid: x = row chunks of
 * AWQ_THREADS, y = block b (so a CUDA block shares one b's importance / covariance). */
__global__ void k_awq_quant(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                            const float *cov, block_q4_0 *q4, float *ratio, float *wq) {
    __shared__ float sh[1024];
    __shared__ float ss[32];
    const int64_t b = blockIdx.y, nb = D / 32;
    const int tid = threadIdx.x;
    if (quant == AWQ_COV)
        for (int i = tid; i < 1024; i += blockDim.x) sh[i] = cov[b * 1024 + i];
    else if (quant == AWQ_DIAG && tid < 32) sh[tid] = imp[b * 32 + tid];
    if (tid < 32) ss[tid] = s ? s[b * 32 + tid] : 1.0f;
    __syncthreads();
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + tid;
    if (r >= R) return;
    float x[32];
    const float4 *w4 = (const float4 *)(W + r * D + b * 32);
    for (int i = 0; i < 8; i++) {
        const float4 v = w4[i];
        x[4 * i] = v.x, x[4 * i + 1] = v.y, x[4 * i + 2] = v.z, x[4 * i + 3] = v.w;
    }
    if (s)
        for (int i = 0; i < 32; i++) x[i] = KV_MUL(x[i], ss[i]);
    int8_t l[32];
    uint16_t dh;
    float rat = 1;
    if (quant == AWQ_COV) rat = search_cov(x, sh, l, &dh);
    else if (quant == AWQ_DIAG) rat = search_diag(x, sh, l, &dh);
    else q4_rtn(x, l, &dh);
    if (q4) {
        block_q4_0 *o = q4 + r * nb + b;
        o->d = dh;
        for (int j = 0; j < 16; j++) o->qs[j] = (uint8_t)((l[j] + 8) | ((l[j + 16] + 8) << 4));
    }
    if (ratio) ratio[r * nb + b] = rat;
    if (wq) {
        const float d = h2f_bits(dh);
        float *o = wq + r * D + b * 32;
        for (int i = 0; i < 32; i++) o[i] = KV_DIV(KV_MUL((float)l[i], d), ss[i]);
    }
}

/* partial[blockIdx] = sum over the block's grid-stride share of ((double)a - (double)b)^2 */
#define AWQ_RED_BLOCKS 512
__global__ void k_awq_sqerr(const float *a, const float *b, int64_t n, double *partial) {
    __shared__ double red[256];
    double e = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double d = (double)a[i] - (double)b[i];
        e += d * d;
    }
    red[threadIdx.x] = e;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

static void launch_awq_quant(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                             const float *cov, block_q4_0 *q4, float *ratio, float *wq) {
    dim3 grid((unsigned)((R + AWQ_THREADS - 1) / AWQ_THREADS), (unsigned)(D / 32));
    k_awq_quant<<<grid, AWQ_THREADS>>>(W, R, D, s, quant, imp, cov, q4, ratio, wq);
}

/* ---- the plugin's entry points (cuda_backend.h) ---- */

struct qf_cuda_awq {
    int64_t n, D, R;
    float *X, *W, *Y, *Wq, *Yq, *s, *imp, *cov; /* device */
    double *part;
    cublasHandle_t blas;
};

void awq_group_free(qf_cuda_awq *a) {
    if (!a) return;
    float *bufs[] = {a->X, a->W, a->Y, a->Wq, a->Yq, a->s, a->imp, a->cov};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    if (a->part) cudaFree(a->part);
    if (a->blas) cublasDestroy(a->blas);
    free(a);
}

static qf_status awq_args(int64_t R, int64_t D, qf_error *err) {
    if (R < 1 || D < 32 || D % 32 || D / 32 > 65535)
        return cu_fail(err, QF_ERR_ARG, "awq on the GPU: %lld x %lld weight: rows >= 1 and a row of 32..2097120 "
                       "elements in blocks of 32 expected", (long long)R, (long long)D);
    return QF_OK;
}

qf_status awq_group_new(const float *X, int64_t n, int64_t D, const float *W, int64_t R, qf_cuda_awq **out,
                        qf_error *err) {
    qf_status st = awq_args(R, D, err);
    *out = NULL;
    if (st) return st;
    if (n < 1 || n > INT32_MAX / 2 || R > INT32_MAX / 2 || D > INT32_MAX / 2)
        return cu_fail(err, QF_ERR_ARG, "awq on the GPU: %lld rows of calibration input: 1..2^30 expected", (long long)n);
    qf_cuda_awq *a = (qf_cuda_awq *)calloc(1, sizeof *a);
    if (!a) return cu_fail(err, QF_ERR_NOMEM, "awq on the GPU: out of host memory");
    a->n = n, a->D = D, a->R = R;
    const float one = 1.0f, zero = 0.0f;
    CK(cudaMalloc((void **)&a->X, (size_t)n * D * 4));
    CK(cudaMalloc((void **)&a->W, (size_t)R * D * 4));
    CK(cudaMalloc((void **)&a->Wq, (size_t)R * D * 4));
    CK(cudaMalloc((void **)&a->Y, (size_t)n * R * 4));
    CK(cudaMalloc((void **)&a->Yq, (size_t)n * R * 4));
    CK(cudaMalloc((void **)&a->s, (size_t)D * 4));
    CK(cudaMalloc((void **)&a->imp, (size_t)D * 4));
    CK(cudaMalloc((void **)&a->cov, (size_t)D * 32 * 4));
    CK(cudaMalloc((void **)&a->part, AWQ_RED_BLOCKS * sizeof(double)));
    CK(cudaMemcpy(a->X, X, (size_t)n * D * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a->W, W, (size_t)R * D * 4, cudaMemcpyHostToDevice));
    if (cublasCreate(&a->blas) != CUBLAS_STATUS_SUCCESS) {
        a->blas = NULL;
        st = cu_fail(err, QF_ERR_DEVICE, "awq on the GPU: cublasCreate failed");
        goto done;
    }
    /* plain f32 (no TF32): Y row-major [n][R] = X [n][D] . W^T, i.e. column-major Y^T = W X^T */
    if (cublasSetMathMode(a->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
        cublasSgemm(a->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, (int)n, (int)D, &one, a->W, (int)D, a->X, (int)D, &zero,
                    a->Y, (int)R) != CUBLAS_STATUS_SUCCESS) {
        st = cu_fail(err, QF_ERR_DEVICE, "awq on the GPU: cublasSgemm failed");
        goto done;
    }
    CK(cudaDeviceSynchronize());
    *out = a;
    return QF_OK;
done:
    awq_group_free(a);
    return st;
}

qf_status awq_group_mse(qf_cuda_awq *a, const float *s, int quant, const float *imp, const float *cov, double *mse,
                        qf_error *err) {
    qf_status st = QF_OK;
    const float one = 1.0f, zero = 0.0f;
    double part[AWQ_RED_BLOCKS], e = 0;
    if ((quant == AWQ_DIAG && !imp) || (quant == AWQ_COV && !cov) || quant < AWQ_RTN || quant > AWQ_COV || !s)
        return cu_fail(err, QF_ERR_ARG, "awq on the GPU: quantizer %d without its scales or importance", quant);
    CK(cudaMemcpy(a->s, s, (size_t)a->D * 4, cudaMemcpyHostToDevice));
    if (quant == AWQ_DIAG) CK(cudaMemcpy(a->imp, imp, (size_t)a->D * 4, cudaMemcpyHostToDevice));
    if (quant == AWQ_COV) CK(cudaMemcpy(a->cov, cov, (size_t)a->D * 32 * 4, cudaMemcpyHostToDevice));
    launch_awq_quant(a->W, a->R, a->D, a->s, quant, a->imp, a->cov, NULL, NULL, a->Wq);
    CK(cudaGetLastError());
    if (cublasSgemm(a->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->R, (int)a->n, (int)a->D, &one, a->Wq, (int)a->D, a->X,
                    (int)a->D, &zero, a->Yq, (int)a->R) != CUBLAS_STATUS_SUCCESS) {
        st = cu_fail(err, QF_ERR_DEVICE, "awq on the GPU: cublasSgemm failed");
        goto done;
    }
    k_awq_sqerr<<<AWQ_RED_BLOCKS, 256>>>(a->Yq, a->Y, a->n * a->R, a->part);
    CK(cudaGetLastError());
    CK(cudaMemcpy(part, a->part, sizeof part, cudaMemcpyDeviceToHost));
    for (int i = 0; i < AWQ_RED_BLOCKS; i++) e += part[i];
    *mse = e / (double)(a->n * a->R);
done:
    return st;
}

qf_status awq_quantize(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                       const float *cov, void *q4, float *ratio, float *deq, qf_error *err) {
    qf_status st = awq_args(R, D, err);
    if (st) return st;
    if ((quant == AWQ_DIAG && !imp) || (quant == AWQ_COV && !cov) || quant < AWQ_RTN || quant > AWQ_COV)
        return cu_fail(err, QF_ERR_ARG, "awq on the GPU: quantizer %d without its importance", quant);
    const int64_t nb = D / 32;
    float *dW = NULL, *ds = NULL, *dimp = NULL, *dcov = NULL, *drat = NULL, *ddeq = NULL;
    block_q4_0 *dq4 = NULL;
    CK(cudaMalloc((void **)&dW, (size_t)R * D * 4));
    CK(cudaMemcpy(dW, W, (size_t)R * D * 4, cudaMemcpyHostToDevice));
    if (s) {
        CK(cudaMalloc((void **)&ds, (size_t)D * 4));
        CK(cudaMemcpy(ds, s, (size_t)D * 4, cudaMemcpyHostToDevice));
    }
    if (quant == AWQ_DIAG) {
        CK(cudaMalloc((void **)&dimp, (size_t)D * 4));
        CK(cudaMemcpy(dimp, imp, (size_t)D * 4, cudaMemcpyHostToDevice));
    }
    if (quant == AWQ_COV) {
        CK(cudaMalloc((void **)&dcov, (size_t)D * 32 * 4));
        CK(cudaMemcpy(dcov, cov, (size_t)D * 32 * 4, cudaMemcpyHostToDevice));
    }
    if (q4) CK(cudaMalloc((void **)&dq4, (size_t)R * nb * sizeof(block_q4_0)));
    if (ratio) CK(cudaMalloc((void **)&drat, (size_t)R * nb * 4));
    if (deq) CK(cudaMalloc((void **)&ddeq, (size_t)R * D * 4));
    launch_awq_quant(dW, R, D, ds, quant, dimp, dcov, dq4, drat, ddeq);
    CK(cudaGetLastError());
    if (q4) CK(cudaMemcpy(q4, dq4, (size_t)R * nb * sizeof(block_q4_0), cudaMemcpyDeviceToHost));
    if (ratio) CK(cudaMemcpy(ratio, drat, (size_t)R * nb * 4, cudaMemcpyDeviceToHost));
    if (deq) CK(cudaMemcpy(deq, ddeq, (size_t)R * D * 4, cudaMemcpyDeviceToHost));
done:
    if (dW) cudaFree(dW);
    if (ds) cudaFree(ds);
    if (dimp) cudaFree(dimp);
    if (dcov) cudaFree(dcov);
    if (dq4) cudaFree(dq4);
    if (drat) cudaFree(drat);
    if (ddeq) cudaFree(ddeq);
    return st;
}
