/* cuda_learn.cu: kv-rq's dense double-precision learning steps on the device (the host side and
 * the oracle: forge/learn_kv_rq.c, forge/learn_kv_rq_klt.c; contracts in cuda_forge.h).
 *
 * On the Llama-3-8B shape (8 KV heads of 128) kv-rq's learning took 197 s of a 317 s
 * `qforge calibrate --artifact kv-rq --bits 2.5 --device cuda` on the H200 machine's 16 cores
 * (docs/gpu.md). Most of it is four loops over [rows][H*D] x [H*D][H*D] in double: the V
 * predictor's Gram sums, its triangular solves and held-in residual, and V minus its prediction
 * for every fitting row (twice: the codebooks and the KLT fit). Here each output element is one
 * thread's running sum over k in the host loop's order, every product and sum rounded on its own
 * (KV_DMUL & co.: nvcc would contract a*b+c into an FMA), so the results are the host's bit for
 * bit and the learned artifact, and with it the certificate, does not depend on the device
 * (test_cuda `op_rq_learn`). */
#include "kernels/cuda/cuda_common.cuh"

extern "C" {
#include "kernels/cuda/cuda_forge.h"
}

#define LT_BM 64 /* outputs per block: LT_BM x LT_BN, 4 x 4 per thread, k in LT_BK steps */
#define LT_BN 64
#define LT_BK 16

enum { LT_GRAM = 0, LT_MINUS = 1, LT_RESID = 2 };

/* One tiled pass, C[m][n] = a running sum over k < K, per MODE:
 *   LT_GRAM   a(m,k) = x[k][m] - mx[m], b(n,k) = z[k][n] - mz[n] (x [K][M], z [K][N]);
 *             c = 0, c += a b;                        out64[m][n] = c
 *   LT_MINUS  a(m,k) = x[m * xs][k], b(n,k) = P[n][k] (floats; x rows of K = N, P [N][K]);
 *             c = y[m * xs][n], c -= b a;              out32[m][n] = (float)(c - mean[n])
 *   LT_RESID  a(m,k) = x[m][k] (float), b(n,k) = W[n][k] (double, W [N][K]);
 *             c = 0, c += b a;                         out64[m][n] = (y[m][n] - my[n]) - c
 * The products and sums are the host loops' (learn_kv_rq.c gram_worker, vres_worker,
 * resid_worker; learn_kv_rq_klt.c klt_unit), each rounded on its own. */
template <int MODE>
__global__ void __launch_bounds__(256)
    k_learn_tile(int M, int N, int K, const float *__restrict__ x, int64_t xs, const void *__restrict__ bsrc,
                 const double *__restrict__ mx, const double *__restrict__ mz, const float *__restrict__ y,
                 const float *__restrict__ mean, double *out64, float *out32) {
    __shared__ double As[LT_BK][LT_BM], Bs[LT_BK][LT_BN];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * LT_BM, n0 = blockIdx.x * LT_BN;
    double c[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            c[i][j] = (MODE == LT_MINUS && m < M && n < N) ? (double)y[(int64_t)m * xs + n] : 0.0;
        }
    for (int k0 = 0; k0 < K; k0 += LT_BK) {
        const int kn = K - k0 < LT_BK ? K - k0 : LT_BK;
        for (int e = threadIdx.x; e < LT_BK * LT_BM; e += 256) {
            int kk, mm;
            if (MODE == LT_GRAM) kk = e / LT_BM, mm = e % LT_BM; /* x [K][M]: m contiguous */
            else kk = e % LT_BK, mm = e / LT_BK;                 /* rows of K: k contiguous */
            const int m = m0 + mm, n = n0 + mm, k = k0 + kk;
            double a = 0, b = 0;
            if (k < K && m < M) {
                if (MODE == LT_GRAM) a = KV_DSUB((double)x[(int64_t)k * M + m], mx[m]);
                else if (MODE == LT_MINUS) a = (double)x[(int64_t)m * xs + k];
                else a = (double)x[(int64_t)m * K + k];
            }
            if (k < K && n < N) {
                if (MODE == LT_GRAM) b = KV_DSUB((double)((const float *)bsrc)[(int64_t)k * N + n], mz[n]);
                else if (MODE == LT_MINUS) b = (double)((const float *)bsrc)[(int64_t)n * K + k];
                else b = ((const double *)bsrc)[(int64_t)n * K + k];
            }
            As[kk][mm] = a, Bs[kk][mm] = b;
        }
        __syncthreads();
        for (int kk = 0; kk < kn; kk++) {
            double av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) av[i] = As[kk][ty + 16 * i], bv[i] = Bs[kk][tx + 16 * i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if (MODE == LT_GRAM) c[i][j] = KV_DADD(c[i][j], KV_DMUL(av[i], bv[j]));
                    else if (MODE == LT_MINUS) c[i][j] = KV_DSUB(c[i][j], KV_DMUL(bv[j], av[i]));
                    else c[i][j] = KV_DADD(c[i][j], KV_DMUL(bv[j], av[i]));
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m >= M || n >= N) continue;
            if (MODE == LT_GRAM) out64[(int64_t)m * N + n] = c[i][j];
            else if (MODE == LT_MINUS) out32[(int64_t)m * N + n] = (float)KV_DSUB(c[i][j], mean ? (double)mean[n] : 0.0);
            else out64[(int64_t)m * N + n] = KV_DSUB(KV_DSUB((double)y[(int64_t)m * N + n], mz[n]), c[i][j]);
        }
}

/* L y = b, then L^T x = y, for column `col` of b [n][m] in place (learn_kv_rq.c chol_sub_worker) */
__global__ void k_chol_sub(const double *__restrict__ L, int n, double *b, int m) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= m) return;
    for (int i = 0; i < n; i++) {
        double v = b[(int64_t)i * m + col];
        for (int k = 0; k < i; k++) v = KV_DSUB(v, KV_DMUL(L[(int64_t)i * n + k], b[(int64_t)k * m + col]));
        b[(int64_t)i * m + col] = __ddiv_rn(v, L[(int64_t)i * n + i]);
    }
    for (int i = n - 1; i >= 0; i--) {
        double v = b[(int64_t)i * m + col];
        for (int k = i + 1; k < n; k++) v = KV_DSUB(v, KV_DMUL(L[(int64_t)k * n + i], b[(int64_t)k * m + col]));
        b[(int64_t)i * m + col] = __ddiv_rn(v, L[(int64_t)i * n + i]);
    }
}

static dim3 lt_grid(int M, int N) { return dim3(nblk((size_t)N, LT_BN), nblk((size_t)M, LT_BM)); }

/* the device buffers' failure (dalloc / dup_to answered NULL) */
static qf_status no_device_memory(dallocs *a, qf_error *err) {
    dfree(a);
    return cu_fail(err, QF_ERR_DEVICE, "kv-rq learn on the GPU: device allocation or copy failed");
}
static bool dims_ok(int64_t a, int64_t b, int64_t c) {
    return a >= 1 && b >= 1 && c >= 1 && a <= (1 << 30) && b <= (1 << 20) && c <= (1 << 20);
}

qf_status learn_gram_f64(const float *x, const float *y, int64_t n, int dx, int dy, const double *mx, const double *my,
                         double *A, double *B, qf_error *err) {
    if (!x || !y || !mx || !my || !A || !B || !dims_ok(n, dx, dy))
        return cu_fail(err, QF_ERR_ARG, "kv-rq learn on the GPU: gram of %lld x (%d, %d): bad shape or a NULL array",
                       (long long)n, dx, dy);
    qf_status st = QF_OK;
    dallocs b = {};
    float *dx_ = (float *)dup_to(&b, x, (size_t)n * dx * 4), *dy_ = (float *)dup_to(&b, y, (size_t)n * dy * 4);
    double *dmx = (double *)dup_to(&b, mx, (size_t)dx * 8), *dmy = (double *)dup_to(&b, my, (size_t)dy * 8);
    double *dA = (double *)dalloc(&b, (size_t)dx * dx * 8), *dB = (double *)dalloc(&b, (size_t)dx * dy * 8);
    if (!dx_ || !dy_ || !dmx || !dmy || !dA || !dB) return no_device_memory(&b, err);
    /* the full symmetric A (both triangles: a product's operands commute exactly, so the upper
     * triangle equals the host's mirrored lower one bit for bit) */
    k_learn_tile<LT_GRAM><<<lt_grid(dx, dx), 256>>>(dx, dx, (int)n, dx_, 0, dx_, dmx, dmx, NULL, NULL, dA, NULL);
    k_learn_tile<LT_GRAM><<<lt_grid(dx, dy), 256>>>(dx, dy, (int)n, dx_, 0, dy_, dmx, dmy, NULL, NULL, dB, NULL);
    CK(cudaGetLastError());
    CK(cudaMemcpy(A, dA, (size_t)dx * dx * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(B, dB, (size_t)dx * dy * 8, cudaMemcpyDeviceToHost));
done:
    dfree(&b);
    return st;
}

qf_status learn_chol_sub_f64(const double *L, int n, double *bm, int m, qf_error *err) {
    if (!L || !bm || !dims_ok(1, n, m))
        return cu_fail(err, QF_ERR_ARG, "kv-rq learn on the GPU: triangular solve of %d x %d: bad shape or a NULL array", n,
                       m);
    qf_status st = QF_OK;
    dallocs b = {};
    double *dL = (double *)dup_to(&b, L, (size_t)n * n * 8), *db = (double *)dup_to(&b, bm, (size_t)n * m * 8);
    if (!dL || !db) return no_device_memory(&b, err);
    k_chol_sub<<<nblk((size_t)m, 32), 32>>>(dL, n, db, m);
    CK(cudaGetLastError());
    CK(cudaMemcpy(bm, db, (size_t)n * m * 8, cudaMemcpyDeviceToHost));
done:
    dfree(&b);
    return st;
}

qf_status learn_rows_minus_f64(const float *y, const float *x, int64_t rows, int64_t stride, int d, const float *P,
                               const float *mean, float *out, qf_error *err) {
    if (!y || !x || !P || !out || stride < 1 || !dims_ok(rows, d, d) || (rows - 1) * stride >= (int64_t)1 << 31)
        return cu_fail(err, QF_ERR_ARG, "kv-rq learn on the GPU: %lld rows (stride %lld) of %d: bad shape or a NULL array",
                       (long long)rows, (long long)stride, d);
    qf_status st = QF_OK;
    dallocs b = {};
    const int64_t span = ((rows - 1) * stride + 1) * d; /* the input rows read, strided */
    float *dy_ = (float *)dup_to(&b, y, (size_t)span * 4), *dx_ = (float *)dup_to(&b, x, (size_t)span * 4);
    float *dP = (float *)dup_to(&b, P, (size_t)d * d * 4), *dmean = mean ? (float *)dup_to(&b, mean, (size_t)d * 4) : NULL;
    float *dout = (float *)dalloc(&b, (size_t)rows * d * 4);
    if (!dy_ || !dx_ || !dP || (mean && !dmean) || !dout) return no_device_memory(&b, err);
    k_learn_tile<LT_MINUS><<<lt_grid((int)rows, d), 256>>>((int)rows, d, d, dx_, stride * d, dP, NULL, NULL, dy_, dmean,
                                                           NULL, dout);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, dout, (size_t)rows * d * 4, cudaMemcpyDeviceToHost));
done:
    dfree(&b);
    return st;
}

qf_status learn_resid_f64(const float *y, const float *xn, int64_t n, int dx, int dy, const double *my, const double *WT,
                          double *dres, qf_error *err) {
    if (!y || !xn || !my || !WT || !dres || !dims_ok(n, dx, dy))
        return cu_fail(err, QF_ERR_ARG, "kv-rq learn on the GPU: residual of %lld x (%d, %d): bad shape or a NULL array",
                       (long long)n, dx, dy);
    qf_status st = QF_OK;
    dallocs b = {};
    float *dy_ = (float *)dup_to(&b, y, (size_t)n * dy * 4), *dxn = (float *)dup_to(&b, xn, (size_t)n * dx * 4);
    double *dmy = (double *)dup_to(&b, my, (size_t)dy * 8), *dW = (double *)dup_to(&b, WT, (size_t)dx * dy * 8);
    double *dd = (double *)dalloc(&b, (size_t)n * dy * 8);
    if (!dy_ || !dxn || !dmy || !dW || !dd) return no_device_memory(&b, err);
    k_learn_tile<LT_RESID><<<lt_grid((int)n, dy), 256>>>((int)n, dy, dx, dxn, dx, dW, NULL, dmy, dy_, NULL, dd, NULL);
    CK(cudaGetLastError());
    CK(cudaMemcpy(dres, dd, (size_t)n * dy * 8, cudaMemcpyDeviceToHost));
done:
    dfree(&b);
    return st;
}

/* ---- the KLT fit's codec-error measurement (learn_kv_rq_klt.c klt_unit) ---- */

/* xm[r][i] = x[r][i] + mean[h][i], row r of head h = r % H (klt_unit's x = X + mean) */
__global__ void k_klt_add_mean(const float *__restrict__ x, const float *__restrict__ mean, int64_t R, int H, int D,
                               float *xm) {
    const int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= R * D) return;
    const int64_t r = w / D;
    const int i = (int)(w % D), h = (int)(r % H);
    xm[w] = KV_ADD(x[w], mean[(size_t)h * D + i]);
}

/* e[r] = sum_i a_i^2, a = enc[h] d, d = x[r] - y[r] (y NULL: d = x[r]): qf_kv_rq_klt_matvec's sums
 * (each over j in order from 0; a float times a float is exact in double) and klt_unit's sum of
 * their squares in i order. One block a row; encT [H][D (j)][D (i)] = enc[h][i][j]. */
__global__ void k_klt_err(const float *__restrict__ encT, const float *__restrict__ x, const float *__restrict__ y,
                          int64_t R, int H, int D, double *e) {
    __shared__ float d[HD_MAX];
    __shared__ double a[HD_MAX];
    const int64_t r = blockIdx.x;
    if (r >= R) return;
    const int h = (int)(r % H), tid = threadIdx.x, nt = blockDim.x;
    for (int i = tid; i < D; i += nt) d[i] = y ? KV_SUB(x[r * D + i], y[r * D + i]) : x[r * D + i];
    __syncthreads();
    for (int i = tid; i < D; i += nt) {
        const float *ec = encT + (size_t)h * D * D + i;
        double acc = 0;
        for (int j = 0; j < D; j++) acc = KV_DADD(acc, KV_DMUL((double)ec[(size_t)j * D], (double)d[j]));
        a[i] = acc;
    }
    __syncthreads();
    if (tid == 0) {
        double s = 0;
        for (int i = 0; i < D; i++) s = KV_DADD(s, KV_DMUL(a[i], a[i]));
        e[r] = s;
    }
}

qf_status learn_klt_measure(const qf_cuda_klt_measure *m, qf_error *err) {
    if (!m || !m->x || !m->mean || !m->cs || !m->enc || !m->dec || !m->sigma || !m->width || !m->klevels ||
        !m->hlevels || !m->den || !m->err3 || !m->errh || m->n_head < 1 || m->n_widths < 1 || m->n_widths > 6 ||
        m->head_dim < 8 || m->head_dim > HD_MAX || (m->head_dim & (m->head_dim - 1)) || m->n_rows < 1 ||
        m->n_rows * m->n_head > (int64_t)1 << 30)
        return cu_fail(err, QF_ERR_ARG, "kv-rq klt measurement on the GPU: %lld rows of %d heads x %d, %d widths: bad "
                                        "shape or a NULL array",
                       m ? (long long)m->n_rows : 0LL, m ? m->n_head : 0, m ? m->head_dim : 0, m ? m->n_widths : 0);
    const int H = m->n_head, D = m->head_dim, NW = m->n_widths;
    const int64_t R = m->n_rows * H;
    const size_t HDn = (size_t)H * D;
    qf_status st = QF_OK;
    dallocs b = {};
    /* host-side: 1 / cs, the bit offsets of each width's codes, the scale table (enc and dec go
     * up as they are and are transposed per head on the device, the codecs' layouts) */
    float *inv = (float *)malloc(HDn * 4);
    uint16_t *bo = (uint16_t *)malloc((size_t)NW * HDn * 2);
    float sc[256];
    rq_scale_table(sc);
    if (!inv || !bo) {
        free(inv), free(bo);
        return cu_fail(err, QF_ERR_NOMEM, "kv-rq klt measurement on the GPU: out of memory");
    }
    for (size_t i = 0; i < HDn; i++) inv[i] = 1.0f / m->cs[i]; /* klt_unit's ics */
    rq_bit_offsets(m->width, (size_t)NW * H, D, bo); /* each width's rows: NW x H heads */
    const size_t rbmax = 1 + ((size_t)D * NW + 7) / 8; /* QF_KV_RQ_SCALE_BYTES + the widest row's codes */
    float *dx = (float *)dup_to(&b, m->x, (size_t)R * D * 4), *dxm = (float *)dalloc(&b, (size_t)R * D * 4);
    float *dy = (float *)dalloc(&b, (size_t)R * D * 4);
    float *dmean = (float *)dup_to(&b, m->mean, HDn * 4), *dcs = (float *)dup_to(&b, m->cs, HDn * 4);
    float *dinv = (float *)dup_to(&b, inv, HDn * 4), *dsig = (float *)dup_to(&b, m->sigma, HDn * 4);
    float *denc = (float *)dup_to(&b, m->enc, HDn * D * 4), *ddec = (float *)dup_to(&b, m->dec, HDn * D * 4);
    float *dencT = (float *)dalloc(&b, HDn * D * 4), *ddecT = (float *)dalloc(&b, HDn * D * 4);
    uint8_t *dw = (uint8_t *)dup_to(&b, m->width, (size_t)NW * HDn);
    uint16_t *dbo = (uint16_t *)dup_to(&b, bo, (size_t)NW * HDn * 2);
    float *dkl = (float *)dup_to(&b, m->klevels, (size_t)NW * HDn * 64 * 4);
    float *dhl = (float *)dup_to(&b, m->hlevels, (size_t)NW * H * 64 * 4);
    float *dsc = (float *)dup_to(&b, sc, sizeof sc);
    uint8_t *dcodes = (uint8_t *)dalloc(&b, (size_t)R * rbmax);
    double *de = (double *)dalloc(&b, (size_t)(1 + 2 * NW) * R * 8);
    free(inv), free(bo);
    if (!dx || !dxm || !dy || !dmean || !dcs || !dinv || !dsig || !denc || !ddec || !dencT || !ddecT || !dw || !dbo ||
        !dkl || !dhl || !dsc || !dcodes || !de)
        return no_device_memory(&b, err);
    launch_transpose_sq(denc, (size_t)H, D, dencT, 0);
    launch_transpose_sq(ddec, (size_t)H, D, ddecT, 0);
    {
        const int nt = D < 128 ? D : 128;
        const float hs = 1.0f / sqrtf((float)D); /* as qf_hadamard computes it */
        k_klt_add_mean<<<nblk((size_t)R * D, 256), 256>>>(dx, dmean, R, H, D, dxm);
        k_klt_err<<<(unsigned)R, nt>>>(dencT, dx, NULL, R, H, D, de);
        for (int w = 0; w < NW; w++) {
            const int bits = w + 1;
            for (int pass = 0; pass < 2; pass++) { /* format 3, then the Hadamard codec */
                rq_enc_dev en = {};
                rq_layer_dev la = {};
                en.dst = dcodes, la.codes = dcodes;
                en.rb = la.rb = 1 + ((size_t)D * bits + 7) / 8;
                en.bits = la.bits = bits;
                en.mean = la.mean = dmean, en.inv_cs = dinv, la.cs = dcs;
                en.scale = la.scale = dsc, en.hs = la.hs = hs;
                if (pass == 0) {
                    en.encT = dencT, la.decT = ddecT;
                    en.sigma = la.sigma = dsig;
                    en.klevels = la.klevels = dkl + (size_t)w * HDn * 64;
                    en.width = la.width = dw + (size_t)w * HDn;
                    la.boff = dbo + (size_t)w * HDn;
                } else en.levels = la.levels = dhl + (size_t)w * H * 64;
                launch_kv_rq_encode(&en, dxm, R, H, D, 0);
                launch_kv_rq_expand(&la, m->n_rows, H, D, dy, 0);
                k_klt_err<<<(unsigned)R, nt>>>(dencT, dxm, dy, R, H, D, de + (size_t)(1 + pass * NW + w) * R);
            }
        }
    }
    CK(cudaGetLastError());
    CK(cudaMemcpy(m->den, de, (size_t)R * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(m->err3, de + R, (size_t)NW * R * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(m->errh, de + (size_t)(1 + NW) * R, (size_t)NW * R * 8, cudaMemcpyDeviceToHost));
done:
    dfree(&b);
    return st;
}
