/* cuda_kv.cu: KV cache rows: f32, f16, q8_0 and q4_0 written with ggml's reference quantizers
 * (bit-exact with quant.c), kv-int8 with static scales, kv-dict codes encoded (the host OMP
 * encoder's bytes) and decoded. */
#include "kernels/cuda/cuda_common.cuh"

/* ---- KV cache rows: f32, f16, q8_0, q4_0 (ggml's reference quantizers) ---- */

/* Thread i's share of writing the n_rows x hd source into cache rows of rb bytes at dst: one
 * element each for f32/f16, one 32-element block each for q8_0/q4_0. */
__device__ static void kv_write_thread(int mode, const float *src, int64_t n_rows, int hd, size_t rb, uint8_t *dst) {
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
    kv_quant_block(mode, src + r * hd + b * QK, dst + r * rb + b * (mode == QF_KV_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0)));
}

/* one thread per 32-element block of the n_rows x hd source */
__global__ void k_kv_write(int mode, const float *src, int64_t n_rows, int hd, size_t rb, uint8_t *dst, const int *dpos,
                           size_t pos_stride) {
    if (dpos) dst += (size_t)*dpos * pos_stride;
    kv_write_thread(mode, src, n_rows, hd, rb, dst);
}

/* kv-int8: one signed byte per element with the static per-channel scales of a kv-int8
 * artifact, as qf_kv_int8_quantize: clamp(x * inv_scale, -127, 127), rounded half away from
 * zero by truncating v +- 0.5. src is [n_tok][dkv], inv [dkv] (this layer's). */
__global__ void k_kv_write_int8(kv8_pair p, int64_t n, int dkv, const int *dpos, size_t pos_stride) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const kv8_io a = kv8_pick(p);
    const float *src = a.src, *inv = a.inv;
    int8_t *dst = a.dst;
    if (dpos) dst += (size_t)*dpos * pos_stride;
    const float v = fminf(fmaxf(KV_MUL(src[i], inv[i % dkv]), -127.0f), 127.0f);
    dst[i] = (int8_t)(int)KV_ADD(v, v >= 0 ? 0.5f : -0.5f);
}

/* the units (elements, rows, groups) of [0, n) a graph-replayed expansion covers: those of
 * positions [0, *dpos + 1), `per` a position (all n without dpos) */
__device__ static inline int64_t kv_expand_lim(int64_t n, const int *dpos, int64_t per) {
    return dpos ? min(n, ((int64_t)*dpos + 1) * per) : n;
}

/* element i of an expansion: f32, or (h16) its __float2half_rn in out's memory */
__device__ static inline void kv_put(float *out, int64_t i, float v, bool h16) {
    if (h16) ((__half *)out)[i] = __float2half_rn(v);
    else out[i] = v;
}

/* Expand elements [0, n) of a layer's int8 cache: q * scale (qf_kv_int8_dequantize). */
__global__ void k_kv_expand_int8(kv8_pair p, int64_t n, int dkv, const int *dpos, bool h16) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const kv8_io a = kv8_pick(p);
    const int8_t *src = a.codes;
    const float *scale = a.scale;
    float *out = a.out;
    if (i < kv_expand_lim(n, dpos, dkv)) kv_put(out, i, KV_MUL((float)src[i], scale[i % dkv]), h16);
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

/* ---- the kv-dict encoder on the device: kv_codes.c's qf_kv_omp_ex (tol 0, alpha0 computed)
 * and qf_kv_code_pack (v1 layout), operation for operation ----
 * One warp per row. alpha0 = D x: lane a, a + 32, ... each run dot8 (8 partial f32 sums over
 * the row, combined ((0+1)+(2+3))+((4+5)+(6+7))); |alpha| is compared on its bit pattern, the
 * first index of the maximum wins; the Cholesky row, the forward / back substitutions and the
 * residual norm run in f64 on lane 0 in the host's order (dot_d's sums lane-parallel, one per
 * lane, each sequential: a product of two floats is exact in f64); alpha = alpha0 - G[:, I]
 * gamma in f32, the selected atoms in order. Every product and sum is rounded on its own (the
 * KV_* intrinsics: no FMA contraction), so the codes are the host encoder's bytes. Scratch per
 * warp in dynamic shared memory (dict_enc_smem): alpha0, alpha [A] f32, the row [hd], L [s][s],
 * cI, y, gamma [s] f64, the dot products [s + 2] f64, the selection [s]. The stopping rules'
 * constants (kv.h's QF_KV_OMP_STOP_CORR, QF_KV_OMP_STOP_PIVOT) come from the engine (qf_gpu_dict_omp). */
#define DICT_ENC_MAX_S 64 /* kv.h's QF_KV_MAX_SPARSITY */
__host__ __device__ static inline size_t dict_enc_smem(int A, int hd, int s) {
    const size_t b = (size_t)8 * ((size_t)s * s + 3 * (size_t)s + (size_t)s + 2) + 4 * (2 * (size_t)A + (size_t)hd + (size_t)s);
    return (b + 15) / 16 * 16;
}
__device__ static inline double dot_d_dev(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s = KV_DADD(s, KV_DMUL((double)a[i], (double)b[i]));
    return s;
}
__global__ void k_kv_dict_encode(const float *x, int64_t n, int hd, const float *atoms, const float *gram, int A, int s,
                                 int q8, size_t rb, uint8_t *codes, int wpb, qf_gpu_dict_omp omp) {
    extern __shared__ double dsm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * wpb + warp;
    if (r >= n) return;
    double *L = dsm + (size_t)warp * (dict_enc_smem(A, hd, s) / 8);
    double *cI = L + (size_t)s * s, *y = cI + s, *gam = y + s, *dt = gam + s;
    float *a0 = (float *)(dt + s + 2), *al = a0 + A, *xs = al + A;
    int *sel = (int *)(xs + hd);
    const float *xr = x + r * hd;
    for (int t = lane; t < hd; t += 32) xs[t] = xr[t];
    __syncwarp();
    const double xx = dot_d_dev(xs, xs, hd); /* every lane: the same sum */
    int k = 0;
    if (xx > 0 && isfinite(xx)) {
        for (int a = lane; a < A; a += 32) { /* dot8 */
            const float *at = atoms + (size_t)a * hd;
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int t = 0;
            for (; t + 8 <= hd; t += 8)
#pragma unroll
                for (int u = 0; u < 8; u++) acc[u] = KV_ADD(acc[u], KV_MUL(at[t + u], xs[t + u]));
            float d = KV_ADD(KV_ADD(KV_ADD(acc[0], acc[1]), KV_ADD(acc[2], acc[3])),
                             KV_ADD(KV_ADD(acc[4], acc[5]), KV_ADD(acc[6], acc[7])));
            for (; t < hd; t++) d = KV_ADD(d, KV_MUL(at[t], xs[t]));
            a0[a] = d, al[a] = d;
        }
        __syncwarp();
        const double stop = omp.stop_corr * sqrt(xx);
        double rr = xx;
        while (k < s) {
            /* argmax |alpha| on the bit patterns, the first index of the maximum */
            uint32_t mx = 0;
            int bi = A;
            for (int a = lane; a < A; a += 32) {
                const uint32_t v = __float_as_uint(al[a]) & 0x7fffffffu;
                if (bi == A || v > mx) mx = v, bi = a;
            }
            for (int o = 16; o > 0; o >>= 1) {
                const uint32_t m2 = __shfl_xor_sync(0xffffffffu, mx, o);
                const int b2 = __shfl_xor_sync(0xffffffffu, bi, o);
                if (m2 > mx || (m2 == mx && b2 < bi)) mx = m2, bi = b2;
            }
            if (mx > 0x7f800000u) break; /* NaN */
            const int best = bi;
            if (best >= A || !((double)fabsf(al[best]) > stop)) break; /* the residual is zero */
            bool dup = false;
            for (int j = 0; j < k; j++) dup |= sel[j] == best;
            if (dup) break;
            /* the dot products the Cholesky row needs: D_I^T d_best (j < k), |d_best|^2 (k), d_best . x (k + 1) */
            const float *db = atoms + (size_t)best * hd;
            for (int j = lane; j < k + 2; j += 32)
                dt[j] = j < k ? dot_d_dev(atoms + (size_t)sel[j] * hd, db, hd) : j == k ? dot_d_dev(db, db, hd)
                                                                                       : dot_d_dev(db, xs, hd);
            __syncwarp();
            int ok = 0;
            if (lane == 0) {
                double *Lk = L + (size_t)k * s;
                double piv = dt[k];
                for (int j = 0; j < k; j++) {
                    double g = dt[j];
                    for (int m = 0; m < j; m++) g = KV_DSUB(g, KV_DMUL(L[(size_t)j * s + m], Lk[m]));
                    Lk[j] = g / L[(size_t)j * s + j];
                    piv = KV_DSUB(piv, KV_DMUL(Lk[j], Lk[j]));
                }
                if (piv > omp.stop_pivot) {
                    ok = 1;
                    Lk[k] = sqrt(piv);
                    sel[k] = best;
                    cI[k] = dt[k + 1];
                    double v = cI[k];
                    for (int j = 0; j < k; j++) v = KV_DSUB(v, KV_DMUL(Lk[j], y[j]));
                    y[k] = v / Lk[k];
                    rr = KV_DSUB(rr, KV_DMUL(y[k], y[k]));
                    const int kk = k + 1;
                    for (int i = kk - 1; i >= 0; i--) {
                        double g = y[i];
                        for (int j = i + 1; j < kk; j++) g = KV_DSUB(g, KV_DMUL(L[(size_t)j * s + i], gam[j]));
                        gam[i] = g / L[(size_t)i * s + i];
                    }
                }
            }
            ok = __shfl_sync(0xffffffffu, ok, 0);
            rr = __shfl_sync(0xffffffffu, rr, 0);
            __syncwarp();
            if (!ok) break; /* the atom is in the span already */
            k++;
            if (rr <= -1.0 || k == s) break; /* tol 0: the host's bound on ||r||^2 is -1 */
            /* alpha = alpha0 - G[:, I] gamma, then the selected atoms zeroed */
            for (int a = lane; a < A; a += 32) {
                float v = a0[a];
                for (int j = 0; j < k; j++) v = KV_SUB(v, KV_MUL(gram[(size_t)sel[j] * A + a], (float)gam[j]));
                al[a] = v;
            }
            __syncwarp();
            if (lane < k) al[sel[lane]] = 0;
            for (int j = lane + 32; j < k; j += 32) al[sel[j]] = 0;
            __syncwarp();
        }
    }
    /* qf_kv_code_pack, v1: byte (A <= 256) or 2-byte indices, then f16 or q8 (f16 scale) coefficients */
    if (lane) return;
    uint8_t *o = codes + r * rb;
    float cf[DICT_ENC_MAX_S];
    for (int j = 0; j < s; j++) {
        const int id = j < k ? sel[j] : 0;
        cf[j] = j < k && isfinite(gam[j]) ? (float)gam[j] : 0.0f;
        if (A <= 256) *o++ = (uint8_t)id;
        else *o++ = (uint8_t)(id & 0xff), *o++ = (uint8_t)(id >> 8);
    }
    if (!q8) {
        for (int j = 0; j < s; j++) {
            const uint16_t h = f32_to_f16_bits(cf[j]);
            *o++ = (uint8_t)(h & 0xff), *o++ = (uint8_t)(h >> 8);
        }
        return;
    }
    float m = 0;
    for (int j = 0; j < s; j++) m = fmaxf(m, fabsf(cf[j]));
    const uint16_t h = f32_to_f16_bits(KV_DIV(m, 127.0f));
    const float sc = h2f_bits(h), inv = sc > 0 ? KV_DIV(1.0f, sc) : 0.0f;
    *o++ = (uint8_t)(h & 0xff), *o++ = (uint8_t)(h >> 8);
    for (int j = 0; j < s; j++) {
        const float v = fminf(fmaxf(KV_MUL(cf[j], inv), -127.0f), 127.0f);
        *o++ = (uint8_t)(int8_t)KV_ADD(v, v >= 0 ? 0.5f : -0.5f);
    }
}

bool launch_kv_dict_encode(const float *x, int64_t n, int hd, const float *atoms, const float *gram, int A, int s, int q8,
                           size_t rb, uint8_t *codes, qf_gpu_dict_omp omp, cudaStream_t st) {
    const size_t per = dict_enc_smem(A, hd, s);
    int wpb = 4;
    while (wpb > 1 && per * wpb > 48 * 1024) wpb /= 2;
    if (per * wpb > 48 * 1024 || s > DICT_ENC_MAX_S || s < 1 || s > A || n <= 0 || !(omp.stop_corr >= 0)) return false;
    k_kv_dict_encode<<<(unsigned)((n + wpb - 1) / wpb), 32 * wpb, per * wpb, st>>>(x, n, hd, atoms, gram, A, s, q8, rb,
                                                                                   codes, wpb, omp);
    return true;
}

/* K and V rows of one batch in one launch: blockIdx.y picks the stream, kv_write_thread writes it */
struct kv_write2_args {
    int mode[2];
    const float *src[2];
    size_t rb[2], stride[2];
    uint8_t *dst[2];
};
__global__ void k_kv_write2(kv_write2_args a, int64_t n_rows, int hd, const int *dpos) {
    pdl_trigger();
    pdl_wait();
    const int s = blockIdx.y, mode = a.mode[s];
    const size_t rb = a.rb[s];
    const float *src = a.src[s];
    uint8_t *dst = a.dst[s] + (dpos ? (size_t)*dpos * a.stride[s] : 0);
    kv_write_thread(mode, src, n_rows, hd, rb, dst);
}

void launch_kv_write2(const qf_kv_mode mode[2], const float *const src[2], int64_t rows, int hd, const size_t rb[2],
                      uint8_t *const dst[2], cudaStream_t s, const int *dpos, const size_t pos_stride[2]) {
    kv_write2_args a;
    size_t nthr = 0;
    for (int k = 0; k < 2; k++) {
        a.mode[k] = (int)mode[k], a.src[k] = src[k], a.rb[k] = rb[k], a.dst[k] = dst[k];
        a.stride[k] = pos_stride ? pos_stride[k] : 0;
        nthr = wmax(nthr, (mode[k] == QF_KV_F32 || mode[k] == QF_KV_F16) ? (size_t)rows * hd : (size_t)rows * (hd / QK));
    }
    cu_launch(k_kv_write2, dim3(nblk(nthr, 256), 2), dim3(256), 0, s, a, rows, hd, dpos);
}

void launch_kv_write(qf_kv_mode mode, const float *src, int64_t rows, int hd, size_t rb, uint8_t *dst, cudaStream_t s,
                     const int *dpos, size_t pos_stride) {
    size_t nthr = (mode == QF_KV_F32 || mode == QF_KV_F16) ? (size_t)rows * hd : (size_t)rows * (hd / QK);
    k_kv_write<<<nblk(nthr, 256), 256, 0, s>>>((int)mode, src, rows, hd, rb, dst, dpos, pos_stride);
}

/* read rows back as the attention kernels see them (tests) */
template <int M> __global__ void k_kv_read(const uint8_t *src, int64_t n_rows, int hd, size_t rb, float *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_rows * hd) out[i] = kv_elem<M>(src + (i / hd) * rb, (int)(i % hd));
}


void launch_kv_read(qf_kv_mode mode, const uint8_t *src, int64_t rows, int hd, size_t rb, float *out, cudaStream_t s) {
    unsigned nb = nblk((size_t)rows * hd, 256);
    switch (mode) {
    case QF_KV_F32: k_kv_read<QF_KV_F32><<<nb, 256, 0, s>>>(src, rows, hd, rb, out); break;
    case QF_KV_F16: k_kv_read<QF_KV_F16><<<nb, 256, 0, s>>>(src, rows, hd, rb, out); break;
    case QF_KV_Q8_0: k_kv_read<QF_KV_Q8_0><<<nb, 256, 0, s>>>(src, rows, hd, rb, out); break;
    case QF_KV_Q4_0: k_kv_read<QF_KV_Q4_0><<<nb, 256, 0, s>>>(src, rows, hd, rb, out); break;
    default: break;
    }
}

void launch_kv_expand_dict(const uint8_t *codes, int64_t n_rows, int hd, size_t rb, const float *atoms, int na,
                           int sparsity, int q8, float *out, cudaStream_t s) {
    k_kv_expand_dict<<<nblk((size_t)n_rows * hd, 256), 256, 0, s>>>(codes, n_rows, hd, rb, atoms, na, sparsity, q8, out);
}

/* ---- kv-int8 row layouts (engine.h qf_kv_int8_layout): STATIC, STATIC_ROT, TOKEN_ROT, TOKEN ----
 * STATIC_ROT and TOKEN_ROT rotate each head row (k_hadamard, bit-identical to qf_hadamard)
 * before quantizing and rotate the expanded rows back. TOKEN rows carry their own scale: the
 * exponent e of step 2^((e-176)/8) in the parities of 8 strided code groups, as kv_codes.c's
 * qf_kv_int8_token_quantize: the step that just avoids clipping (log2f guess, then raised while
 * amax / step > 127), codes lrintf(clamp(x / step)), each group's parity fixed by moving the
 * code whose squared-error increase is least (first index on ties, -1 before +1), and the next
 * finer step kept when its total squared error is lower. The steps are the host's exp2f values
 * (kv_tok_steps), every f32 operation rounded on its own as on the host. One warp per head row
 * of hd <= HD_MAX elements: element i = lane + 32 j lies in group lane % 8. */
void kv_tok_steps(float *t) {
    for (int e = 0; e < 256; e++) t[e] = exp2f((float)(e - 176) * (1.0f / 8.0f)); /* kv_codes.c's tok_step */
    /* ec-rot: kv_codes.c's ec_step, e = 0 .. 1023 (0 is the zero row's and never used as a step) */
    for (int e = 0; e < 1024; e++) t[KV_EC_STEP_OFF + e] = exp2f((float)(e - 704) * (1.0f / 32.0f));
}

/* codes of one row at exponent e into q[], parities fixed; returns the squared error (all lanes) */
__device__ static double tok_encode_warp(const float *xr, int hd, int e, const float *step, int lane, int8_t *q) {
    const float s = step[e], inv = __fdiv_rn(1.0f, s);
    int c[HD_MAX / 32];
    int par = 0;
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int i = lane + 32 * j;
        c[j] = 0;
        if (i < hd) {
            const float v = fminf(fmaxf(__fmul_rn(xr[i], inv), -127.0f), 127.0f);
            c[j] = __float2int_rn(v);
            par ^= c[j] & 1;
        }
    }
    /* the parity of group lane % 8: xor over lanes lane, lane ^ 8, lane ^ 16, lane ^ 24 */
    par ^= __shfl_xor_sync(0xffffffffu, par, 8);
    par ^= __shfl_xor_sync(0xffffffffu, par, 16);
    /* a group whose parity is not bit g of e moves one code: every lane finds its cheapest move
     * (none when its group is fine), then the group's 4 lanes agree on the cheapest (all lanes
     * run the shuffles) */
    const int g = lane & 7;
    const bool fix = par != ((e >> g) & 1);
    float best_cost = INFINITY;
    int best_i = 1 << 30, best_c = 0;
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int i = lane + 32 * j;
        if (!fix || i >= hd) continue;
        const float v = fminf(fmaxf(__fmul_rn(xr[i], inv), -127.0f), 127.0f);
        for (int d = -1; d <= 1; d += 2) {
            const int c2 = c[j] + d;
            if (c2 < -127 || c2 > 127) continue;
            const float a = __fsub_rn(v, (float)c2), b = __fsub_rn(v, (float)c[j]);
            const float cost = __fsub_rn(__fmul_rn(a, a), __fmul_rn(b, b));
            if (cost < best_cost) best_cost = cost, best_i = i, best_c = c2;
        }
    }
    for (int o = 8; o <= 16; o <<= 1) { /* min cost, then the smaller index */
        const float oc = __shfl_xor_sync(0xffffffffu, best_cost, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_i, o), ocv = __shfl_xor_sync(0xffffffffu, best_c, o);
        if (oc < best_cost || (oc == best_cost && oi < best_i)) best_cost = oc, best_i = oi, best_c = ocv;
    }
    if (fix) {
#pragma unroll
        for (int j = 0; j < HD_MAX / 32; j++)
            if (lane + 32 * j == best_i) c[j] = best_c;
    }
    double err = 0.0;
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int i = lane + 32 * j;
        if (i >= hd) continue;
        q[j] = (int8_t)c[j];
        const double dd = __dsub_rn((double)xr[i], __dmul_rn((double)c[j], (double)s));
        err = __dadd_rn(err, isfinite(dd) ? __dmul_rn(dd, dd) : 1e300);
    }
    for (int o = 16; o > 0; o >>= 1) err = __dadd_rn(err, __shfl_xor_sync(0xffffffffu, err, o));
    return err;
}

__global__ void k_kv_write_int8_tok(kv8_pair p, int64_t rows, int hd, const float *step, const int *dpos,
                                    size_t pos_stride) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const kv8_io a = kv8_pick(p);
    const float *src = a.src;
    int8_t *dst = a.dst;
    if (dpos) dst += (size_t)*dpos * pos_stride;
    const float *xr = src + r * hd;
    float amax = 0.0f;
    for (int i = lane; i < hd; i += 32) amax = fmaxf(amax, fabsf(xr[i]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;
    if (amax > 0 && isfinite(amax)) {
        e = (int)ceilf(8.0f * log2f(__fdiv_rn(amax, 127.0f))) + 176;
        if (e < 1) e = 1;
        if (e > 255) e = 255;
        while (e < 255 && __fdiv_rn(amax, step[e]) > 127.0f) e++;
    }
    int8_t q[HD_MAX / 32], alt[HD_MAX / 32];
    const double err = tok_encode_warp(xr, hd, e, step, lane, q);
    if (e > 0 && tok_encode_warp(xr, hd, e - 1, step, lane, alt) < err)
        for (int j = 0; j < HD_MAX / 32; j++) q[j] = alt[j];
    for (int j = 0; j < HD_MAX / 32; j++)
        if (lane + 32 * j < hd) dst[r * hd + lane + 32 * j] = q[j];
}

__global__ void k_kv_expand_int8_tok(kv8_pair p, int64_t rows, int hd, const float *step, const int *dpos, int nkv,
                                     bool h16) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= kv_expand_lim(rows, dpos, nkv)) return;
    const kv8_io a = kv8_pick(p);
    const int8_t *src = a.codes;
    float *out = a.out;
    int par = 0;
    for (int i = lane; i < hd; i += 32) par ^= ((uint8_t)src[r * hd + i] & 1);
    par ^= __shfl_xor_sync(0xffffffffu, par, 8);
    par ^= __shfl_xor_sync(0xffffffffu, par, 16);
    /* e bit g = parity of group g, which lane g holds */
    int e = 0;
    for (int g = 0; g < 8; g++) e |= __shfl_sync(0xffffffffu, par, g) << g;
    const float s = step[e];
    for (int i = lane; i < hd; i += 32) kv_put(out, r * hd + i, __fmul_rn((float)src[r * hd + i], s), h16);
}

/* ---- kv-int8 EC_ROT: kv_codes.c's qf_kv_int8_ec_quantize / _dequantize on the device ----
 * The kv heads of one token are coded in groups of g heads (kv_ec_group: kv_cache.c's
 * ec_group), each group ONE entropy-coded row of n = g * hd elements in n bytes: a 10-bit step
 * exponent e (step 2^((e - 704) / 32), the host's exp2f values from kv_tok_steps), then per
 * element the prefix code of h = c >> 4, the 4 low bits of c and a sign bit, LSB first. The
 * encoder takes the finest step whose codes fit in 8 n bits: the code length only grows as the
 * step shrinks, so the walk from the host's start guess ends on the same e from any start. Every
 * f32 / f64 operation is rounded on its own (no contraction), as on the host. The encoder runs a
 * warp per group row, the decoder a thread per 32-element chunk of one (both below). */
int kv_ec_group(int nkv, int hd) {
    int g = 1;
    for (int d = 1; d <= nkv; d++)
        if (nkv % d == 0 && d * hd <= 256) g = d;
    return g;
}

__device__ static inline int ec_code_of_d(float x, float inv, int cmax) {
    const float v = __fmul_rn(fabsf(x), inv);
    if (!(v < (float)cmax)) return isfinite(x) ? cmax : 0;
    const int c = (int)__fadd_rn(v, 0.5f);
    return c > cmax ? cmax : c;
}
__device__ static inline int ec_code_bits_d(int c) {
    const int h = c >> 4;
    return 5 + (h < 2 ? 2 : h < 5 ? 3 : h - 1);
}
/* ec-rot's encoder, one warp a group row (EC_WARPS rows a block). Lane l holds elements
 * [l k, l k + k), k = ceil(n / 32). The step exponent is the host's: the smallest e whose codes
 * fit in 8 n bits (the code length never grows with e, so the walk from the RMS guess ends on
 * the same e whatever the guess; the lanes' partial sums of squares only move the guess). The
 * codes are then laid out by an exclusive scan of the lanes' bit counts and OR-ed into a
 * zeroed shared-memory copy of the row, which the warp stores: the host encoder's bytes. */
#define EC_WARPS 4
__device__ static inline int ec_lane_bits(const float *x, int i0, int i1, float inv, int cmax) {
    int b = 0;
    for (int i = i0; i < i1; i++) b += ec_code_bits_d(ec_code_of_d(x[i], inv, cmax));
    return b;
}
__device__ static inline long ec_row_bits_w(const float *x, int i0, int i1, float inv, int cmax) {
    int b = ec_lane_bits(x, i0, i1, inv, cmax);
    for (int o = 16; o > 0; o >>= 1) b += __shfl_xor_sync(0xffffffffu, b, o);
    return 10 + (long)b;
}
/* nb <= 32 bits of v (nothing above them) at bit pos of the shared row w */
__device__ static inline void ec_or_bits(uint32_t *w, int pos, uint32_t v, int nb) {
    const int k = pos >> 5, sh = pos & 31;
    atomicOr(w + k, v << sh);
    if (sh && sh + nb > 32) atomicOr(w + k + 1, v >> (32 - sh));
}

__global__ void __launch_bounds__(EC_WARPS * 32)
    k_kv_write_int8_ec(kv8_pair p, int64_t n_rows, int n, const float *steps, const int *dpos, size_t pos_stride,
                       size_t ix_stride) {
    __shared__ uint32_t rw[EC_WARPS][HD_MAX / 4 + 1]; /* a row of n <= HD_MAX bytes (kv_ec_group), zeroed past it */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * EC_WARPS + warp;
    if (r >= n_rows) return; /* the whole warp */
    const kv8_io a = kv8_pick(p);
    const float *src = a.src;
    uint8_t *dst = (uint8_t *)a.dst;
    uint16_t *ix = a.ix;
    if (dpos) dst += (size_t)*dpos * pos_stride;
    if (dpos && ix) ix += (size_t)*dpos * ix_stride;
    const float *x = src + r * n;
    uint8_t *q = dst + r * n;
    uint32_t *w = rw[warp];
    const int nix = kv_ec_index(n); /* index entries a row: the bit where element KV_EC_CHUNK c starts */
    const float *st = steps + KV_EC_STEP_OFF;
    const int kk = (n + 31) / 32, i0 = min(n, lane * kk), i1 = min(n, i0 + kk), nw = (n + 3) / 4;
    for (int j = lane; j <= nw; j += 32) w[j] = 0;
    double ss = 0;
    for (int i = i0; i < i1; i++)
        if (isfinite(x[i])) ss = __dadd_rn(ss, __dmul_rn((double)x[i], (double)x[i]));
    for (int o = 16; o > 0; o >>= 1) ss = __dadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
    __syncwarp();
    if (ss > 0 && isfinite(ss)) { /* else e = 0: the zero row */
        const long budget = 8L * n;
        int cmax = 1023;
        const double e0 = 704 + ceil(32.0 * log2(sqrt(ss / n) / 57.0));
        int e = e0 < 1 ? 1 : e0 > 1023 ? 1023 : (int)e0;
        /* the steps of the 32 exponents around the guess, one a lane, loaded together: a walk's
         * step reads its step by a shuffle instead of a dependent load (e is the warp's) */
        const int eb = min(max(e - 15, 1), 1023 - 31);
        const float sw = st[eb + lane];
        auto inv_of = [&](int ee) {
            const float sv = ee >= eb && ee < eb + 32 ? __shfl_sync(0xffffffffu, sw, ee - eb) : st[ee];
            return __fdiv_rn(1.0f, sv);
        };
        if (ec_row_bits_w(x, i0, i1, inv_of(e), cmax) <= budget) {
            while (e > 1 && ec_row_bits_w(x, i0, i1, inv_of(e - 1), cmax) <= budget) e--;
        } else {
            while (e < 1023 && ec_row_bits_w(x, i0, i1, inv_of(e), cmax) > budget) e++;
            while (cmax > 15 && ec_row_bits_w(x, i0, i1, inv_of(e), cmax) > budget) cmax = cmax > 30 ? cmax / 2 : 15;
        }
        const float inv = inv_of(e);
        const int mine = ec_lane_bits(x, i0, i1, inv, cmax);
        int incl = mine; /* inclusive scan of the lanes' bit counts */
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += t;
        }
        int pos = 10 + incl - mine;
        if (lane == 0) ec_or_bits(w, 0, (uint32_t)e, 10);
        for (int i = i0; i < i1; i++) {
            const int c = ec_code_of_d(x[i], inv, cmax), h = c >> 4;
            if (nix && i && i % KV_EC_CHUNK == 0) ix[r * nix + i / KV_EC_CHUNK - 1] = (uint16_t)pos;
            if (h < 2) ec_or_bits(w, pos, (uint32_t)(h << 1), 2), pos += 2;
            else if (h < 5) ec_or_bits(w, pos, 1u | (uint32_t)((h - 2) & 1) << 1 | (uint32_t)((h - 2) >> 1) << 2, 3), pos += 3;
            else {
                ec_or_bits(w, pos, 7u, 3), pos += 3;
                for (int m = h - 5; m > 0;) { /* h - 5 ones, then the terminating zero */
                    const int t = m < 31 ? m : 31;
                    ec_or_bits(w, pos, (1u << t) - 1, t), pos += t, m -= t;
                }
                pos++;
            }
            ec_or_bits(w, pos, (uint32_t)(c & 15) | (x[i] < 0 && c ? 16u : 0u), 5), pos += 5;
        }
    }
    __syncwarp();
    const uint8_t *wb = (const uint8_t *)w;
    for (int b = lane; b < n; b += 32) q[b] = wb[b];
}

/* ec-rot's decoder: kv_codes.c's qf_kv_int8_ec_dequantize, bit for bit, on the rows the encoder
 * above wrote. A block of EC_DEC_T threads takes R = EC_DEC_T / nch rows: their bytes are
 * loaded into shared memory whole (coalesced), thread (row, chunk) decodes KV_EC_CHUNK elements
 * (the whole row below two chunks) from the bit the row's index holds, into a shared copy of the
 * rows (row stride S, element j at j + j / 32: the threads of a warp write distinct banks), and
 * the block stores the R rows coalesced. The codes are read by ec_decode_run (cuda_common.cuh);
 * an element that would end past the row, and the rest of its chunk, is 0 (rows the encoder
 * wrote never do). */
#define EC_DEC_T 128
/* dynamic shared memory: the R rows' words (stride ec_dec_ws: the n / 4 words and at least the
 * three after them, which ec_decode_run may read; odd, so rows start in different banks), then
 * their floats (stride S); at most 41 KiB (n = 60: 128 rows), 21 KB for 256-element rows */
__host__ __device__ static inline int ec_dec_stride(int n, int nch);
__host__ __device__ static inline int ec_dec_ws(int n) { return (n / 4 + 3) | 1; }
static size_t ec_dec_smem(int n) {
    const int nch = kv_ec_index(n) + 1, R = EC_DEC_T / nch;
    return (size_t)R * ec_dec_ws(n) * 4 + (size_t)R * ec_dec_stride(n, nch) * 4;
}
__host__ __device__ static inline int ec_dec_stride(int n, int nch) {
    const int s = n + (n + 31) / 32;
    return nch > 1 ? s : (s | 1);
}
__global__ void __launch_bounds__(EC_DEC_T)
    k_kv_expand_int8_ec(kv8_pair p, int64_t n_rows, int n, const float *steps, const int *dpos, int per, bool h16) {
    extern __shared__ uint32_t qin[]; /* R rows of WS words, then xs */
    const int nix = kv_ec_index(n), nch = nix + 1, R = EC_DEC_T / nch, nw = n / 4, WS = ec_dec_ws(n), S = ec_dec_stride(n, nch);
    float *xs = (float *)(qin + R * WS); /* R rows of S floats */
    const int64_t lim = kv_expand_lim(n_rows, dpos, per), r0 = (int64_t)blockIdx.x * R;
    if (r0 >= lim) return; /* the whole block */
    const kv8_io a = kv8_pick(p);
    const uint8_t *src = (const uint8_t *)a.codes;
    const uint16_t *ix = a.eix;
    float *out = a.out;
    const int nr = (int)min((int64_t)R, lim - r0), tid = threadIdx.x;
    const uint32_t *g = (const uint32_t *)(src + r0 * n); /* n % 4 == 0, rows 4-byte aligned (set_kv) */
    for (int w = tid; w < nr * nw; w += EC_DEC_T) qin[(w / nw) * WS + w % nw] = __ldg(g + w);
    __syncthreads();
    const int r = tid / nch, ch = tid % nch;
    if (r < nr) {
        const uint32_t *q = qin + r * WS;
        float *x = xs + r * S;
        const int i0 = ch * KV_EC_CHUNK, i1 = nch == 1 ? n : min(n, i0 + KV_EC_CHUNK);
        const uint32_t e = q[0] & 1023u;
        int i = i0;
        if (e) {
            const int pos = ch ? __ldg(ix + (r0 + r) * nix + ch - 1) : 10;
            i = ec_decode_run(q, nw, pos, n * 8, i0, i1, steps[KV_EC_STEP_OFF + e],
                              [&](int k, float v) { x[k + (k >> 5)] = v; });
        }
        for (; i < i1; i++) x[i + (i >> 5)] = 0;
    }
    __syncthreads();
    for (int k = tid; k < nr * n; k += EC_DEC_T) {
        const int rr = k / n, j = k % n;
        kv_put(out, r0 * n + k, xs[rr * S + j + (j >> 5)], h16);
    }
}

void launch_kv_int8_write(int layout, const kv8_io *io, int ns, int64_t n_tok, int nkv, int hd, const float *step,
                          cudaStream_t s, const int *dpos, size_t pos_stride, bool rotate) {
    const int64_t rows = n_tok * nkv;
    kv8_pair p = {};
    float *rx[2];
    int64_t rr[2];
    for (int k = 0; k < ns; k++) p.s[k] = io[k], rx[k] = io[k].src, rr[k] = rows;
    if (rotate && kv_int8_rotated(layout)) launch_hadamard_n(rx, rr, ns, hd, s);
    if (layout == 0 || layout == 1) {
        const int64_t n = rows * hd;
        k_kv_write_int8<<<dim3(nblk((size_t)n, 256), ns), 256, 0, s>>>(p, n, nkv * hd, dpos, pos_stride);
    } else if (layout == 4) {
        const int n = kv_ec_group(nkv, hd) * hd;
        const int64_t groups = rows * hd / n;
        k_kv_write_int8_ec<<<dim3(nblk((size_t)groups, EC_WARPS), ns), EC_WARPS * 32, 0, s>>>(
            p, groups, n, step, dpos, pos_stride, kv_ec_index_per_pos(nkv, hd));
    } else
        k_kv_write_int8_tok<<<dim3(nblk((size_t)rows, 4), ns), 128, 0, s>>>(p, rows, hd, step, dpos, pos_stride);
}

void launch_kv_int8_expand(int layout, const kv8_io *io, int ns, int64_t n_tok, int nkv, int hd, const float *step,
                           cudaStream_t s, const int *dpos, bool rot_back, bool h16) {
    const int64_t rows = n_tok * nkv;
    kv8_pair p = {};
    for (int k = 0; k < ns; k++) p.s[k] = io[k];
    if (layout == 0 || layout == 1) {
        const int64_t n = rows * hd;
        k_kv_expand_int8<<<dim3(nblk((size_t)n, 256), ns), 256, 0, s>>>(p, n, nkv * hd, dpos, h16);
    } else if (layout == 4) {
        const int n = kv_ec_group(nkv, hd) * hd;
        const int64_t groups = rows * hd / n;
        const int nch = kv_ec_index(n) + 1, R = EC_DEC_T / nch;
        /* every n set_kv admits (16 .. HD_MAX, a multiple of 4) fits the default 48 KB: an invariant */
        const size_t smem = ec_dec_smem(n);
        if (smem > 48 * 1024) {
            fprintf(stderr, "qforge: ec-rot rows of %d bytes exceed the decoder's shared memory\n", n);
            abort();
        }
        k_kv_expand_int8_ec<<<dim3(nblk((size_t)groups, R), ns), EC_DEC_T, smem, s>>>(p, groups, n, step, dpos,
                                                                                     nkv * hd / n, h16);
    } else
        k_kv_expand_int8_tok<<<dim3(nblk((size_t)rows, 4), ns), 128, 0, s>>>(p, rows, hd, step, dpos, nkv, h16);
    if (rot_back && !h16 && kv_int8_rotated(layout)) { /* all n_tok rows, even with dpos */
        float *rx[2];
        int64_t rr[2];
        for (int k = 0; k < ns; k++) rx[k] = io[k].out, rr[k] = rows;
        launch_hadamard_n(rx, rr, ns, hd, s);
    }
}

/* ---- kv-rq rows (format/kv_rq_row.h), decoded as kv_rq.c / kv_rq_klt.c / kv_cache.c do ----
 * One block per (position, kv head) row, its elements over the threads. Every f32 operation is
 * rounded on its own (KV_MUL / KV_ADD) and the sums run in the host's order, so each decoded
 * value is the host decoder's bit for bit:
 *   whole-bit rows  x = mean + cs (.) (H(s levels[code]) * (1 / sqrtf(hd)))   (qf_hadamard's
 *                   butterfly in shared memory)
 *   format 3 rows   x = mean + sum_j dec[:, j] y_j over y_j != 0, y_j = (s sigma_j) levels_j[code_j]
 *   f16 rows        the halves
 *   V predicted     (any of the above, f16 rows too: they hold the residual as well)
 *                   x += sum over kv heads g of (sum_q P[h hd + i][g hd + q] khat_g[q]),
 *                   khat the token's decoded pre-RoPE K row (kv_cache.c read_rows) */
/* format-3 coefficient i of a row (cb: its codes, s: its scale): (s sigma_i) levels_i[code_i], 0
 * for a dropped coordinate (kv_rq_klt.c's decoder, each f32 product rounded on its own) */
__device__ static inline float rq3_coef(const rq_layer_dev &a, const uint8_t *cb, size_t lh, int i, float s) {
    const int w = a.width[lh + i];
    if (!w) return 0.0f;
    const uint32_t b = a.boff[lh + i];
    uint32_t x = cb[b >> 3];
    if ((b & 7) + w > 8) x |= (uint32_t)cb[(b >> 3) + 1] << 8;
    return KV_MUL(KV_MUL(s, a.sigma[lh + i]), a.klevels[(lh + i) * 64 + ((x >> (b & 7)) & ((1u << w) - 1))]);
}

__global__ void k_kv_rq_expand(rq_layer_dev a, int64_t n_pos, int nkv, int hd, float *out) {
    __shared__ float y[HD_MAX];
    const int64_t r = blockIdx.x;
    if (r >= n_pos * nkv) return;
    const int h = (int)(r % nkv), p = (int)(r / nkv), HD = nkv * hd;
    const uint8_t *row = a.codes + (size_t)r * a.rb, *cb = row + 1; /* QF_KV_RQ_SCALE_BYTES */
    float *o = out + (size_t)r * hd;
    const size_t lh = (size_t)h * hd;
    float res[HD_MAX / 32];
    if (a.bits == 16) { /* QF_KV_RQ_BITS_F16: halves (V's prediction is still added below) */
        int k = 0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x, k++) res[k] = h2f(row + 2 * i);
    } else if (a.decT) { /* format 3 */
        const float s = a.scale[row[0]];
        for (int i = threadIdx.x; i < hd; i += blockDim.x) y[i] = rq3_coef(a, cb, lh, i, s);
        __syncthreads();
        int k = 0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x, k++) {
            float v = a.mean[lh + i];
            const float *dc = a.decT + lh * hd + i; /* dec[i][j] at dc[j * hd] */
            for (int j = 0; j < hd; j++) {
                const float yj = y[j];
                if (yj == 0.0f) continue;
                v = KV_ADD(v, KV_MUL(dc[(size_t)j * hd], yj));
            }
            res[k] = v;
        }
    } else {
        const float s = a.scale[row[0]];
        const int bits = a.bits;
        const float *lv = a.levels + (size_t)h * 64;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            const uint32_t b = (uint32_t)i * bits;
            uint32_t x = cb[b >> 3];
            if ((b & 7) + bits > 8) x |= (uint32_t)cb[(b >> 3) + 1] << 8;
            y[i] = KV_MUL(s, lv[(x >> (b & 7)) & ((1u << bits) - 1)]);
        }
        __syncthreads();
        for (int len = 1; len < hd; len <<= 1) {
            for (int q = threadIdx.x; q < hd / 2; q += blockDim.x) {
                const int i = (q / len) * 2 * len + q % len;
                const float u = y[i], w = y[i + len];
                y[i] = u + w;
                y[i + len] = u - w;
            }
            __syncthreads();
        }
        int k = 0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x, k++)
            res[k] = KV_ADD(a.mean[lh + i], KV_MUL(a.cs[lh + i], KV_MUL(y[i], a.hs)));
    }
    if (a.predT) { /* the kv heads' partial sums in parallel, each in the host's order, then added in order */
        extern __shared__ float part[]; /* [nkv][hd] */
        const float *kh = a.khat + (size_t)p * HD;
        for (int w = threadIdx.x; w < nkv * hd; w += blockDim.x) {
            const int g2 = w / hd, i = w % hd;
            const float *pc = a.predT + lh + i; /* P[h hd + i][c] at pc[c * HD] */
            float acc = 0.0f;
            for (int q = 0; q < hd; q++) {
                const int c = g2 * hd + q;
                acc = KV_ADD(acc, KV_MUL(pc[(size_t)c * HD], kh[c]));
            }
            part[w] = acc;
        }
        __syncthreads();
    }
    int k = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x, k++) {
        float v = res[k];
        if (a.predT) {
            extern __shared__ float part[];
            for (int g2 = 0; g2 < nkv; g2++) v = KV_ADD(v, part[g2 * hd + i]);
        }
        o[i] = v;
    }
}

void launch_kv_rq_expand(const rq_layer_dev *a, int64_t n_pos, int nkv, int hd, float *out, cudaStream_t s) {
    if (n_pos <= 0) return;
    const size_t smem = a->predT ? (size_t)nkv * hd * sizeof(float) : 0; /* the predictor's partial sums */
    const int threads = a->predT ? 256 : hd < 128 ? 64 : 128;
    k_kv_rq_expand<<<(unsigned)(n_pos * nkv), threads, smem, s>>>(*a, n_pos, nkv, hd, out);
}

/* Format-3 rows of a layer as coefficients, for a GEMM to decode (the forward pass's route;
 * engine.h "kv-rq in the coefficient domain"): y[r][i] = (s sigma_i) levels_i[code_i] (0 for a
 * dropped coordinate), out[r][i] = mean[h][i], so that out += y dec^T per head decodes them. */
__global__ void k_kv_rq_coef3(rq_layer_dev a, int64_t n_rows, int nkv, int hd, float *y, float *out) {
    const int64_t r = blockIdx.x;
    if (r >= n_rows) return;
    const int h = (int)(r % nkv);
    const uint8_t *row = a.codes + (size_t)r * a.rb, *cb = row + 1; /* QF_KV_RQ_SCALE_BYTES */
    const size_t lh = (size_t)h * hd;
    const float s = a.scale[row[0]];
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        y[(size_t)r * hd + i] = rq3_coef(a, cb, lh, i, s);
        out[(size_t)r * hd + i] = a.mean[lh + i];
    }
}

void launch_kv_rq_coef3(const rq_layer_dev *a, int64_t n_pos, int nkv, int hd, float *y, float *out, cudaStream_t s) {
    if (n_pos <= 0) return;
    k_kv_rq_coef3<<<(unsigned)(n_pos * nkv), hd < 128 ? 64 : 128, 0, s>>>(*a, n_pos * nkv, nkv, hd, y, out);
}

/* ---- exact sinks and recent window (kv_cache.c qf_kv_cache_set_exact, forward.c's rule) ----
 * sink [n_sink][dkv] and win [n_window][dkv] are f16 bits; win_pos[slot] = the position a
 * window slot holds (-1: none). */
__device__ static inline float f16_round(float x) { return h2f_bits(f32_to_f16_bits(x)); }

/* the batch's positions below n_sink into the sink store (post-RoPE K, V) */
__global__ void k_kv_sink_write(uint16_t *sink, const float *fresh, int pos0, int n, int n_sink, int dkv) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int hi = pos0 + n < n_sink ? pos0 + n : n_sink;
    if (pos0 >= hi || i >= (int64_t)(hi - pos0) * dkv) return;
    sink[(size_t)pos0 * dkv + i] = f32_to_f16_bits(fresh[i]);
}

/* the exact view of the positions a batch at [pos0, pos0 + n) reads exactly: [0, n_sink) and
 * [lo, pos0 + n), lo = max(n_sink, pos0 - n_window + 1); the batch's own rows rounded to f16,
 * then the sink store, then a window slot that holds the position, else the stored row
 * (forward.c exact_gather). dst may be stored itself (one query: its exact rows replace the
 * stored ones). */
__global__ void k_kv_exact_gather(float *dst, const float *stored, const float *fresh, const uint16_t *sink,
                                  const uint16_t *win, const int *win_pos, int n_sink, int n_window, int pos0, int n,
                                  int dkv) {
    const int T = pos0 + n, ns = n_sink < T ? n_sink : T;
    const int lw = pos0 - n_window + 1, lo = lw > n_sink ? lw : n_sink;
    const int64_t n_win = lo < T ? T - lo : 0;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (ns + n_win) * dkv) return;
    const int pp = (int)(i / dkv), e = (int)(i % dkv);
    const int p = pp < ns ? pp : lo + (pp - ns);
    float v;
    if (p >= pos0) v = f16_round(fresh[(size_t)(p - pos0) * dkv + e]);
    else if (p < n_sink) v = h2f_bits(sink[(size_t)p * dkv + e]);
    else if (n_window > 0 && win_pos[p % n_window] == p) v = h2f_bits(win[(size_t)(p % n_window) * dkv + e]);
    else v = stored[(size_t)p * dkv + e];
    dst[(size_t)p * dkv + e] = v;
}

/* after attention: the batch's last n_window rows into the window ring (qf_kv_cache_push_window) */
__global__ void k_kv_window_push(uint16_t *win, int *win_pos, const float *fresh, int pos0, int n, int n_window,
                                 int dkv) {
    const int first = n > n_window ? n - n_window : 0;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)(n - first) * dkv) return;
    const int t = first + (int)(i / dkv), e = (int)(i % dkv), p = pos0 + t, slot = p % n_window;
    win[(size_t)slot * dkv + e] = f32_to_f16_bits(fresh[(size_t)t * dkv + e]);
    if (e == 0) win_pos[slot] = p;
}

void launch_kv_sink_write(uint16_t *sink, const float *fresh, int pos0, int n, int n_sink, int dkv, cudaStream_t s) {
    if (pos0 >= n_sink) return;
    k_kv_sink_write<<<nblk((size_t)n * dkv, 256), 256, 0, s>>>(sink, fresh, pos0, n, n_sink, dkv);
}

void launch_kv_exact_gather(float *dst, const float *stored, const float *fresh, const uint16_t *sink,
                            const uint16_t *win, const int *win_pos, int n_sink, int n_window, int pos0, int n, int dkv,
                            cudaStream_t s) {
    const int T = pos0 + n, lw = pos0 - n_window + 1, lo = lw > n_sink ? lw : n_sink;
    const size_t rows = (size_t)(n_sink < T ? n_sink : T) + (size_t)(lo < T ? T - lo : 0);
    if (!rows) return;
    k_kv_exact_gather<<<nblk(rows * dkv, 256), 256, 0, s>>>(dst, stored, fresh, sink, win, win_pos, n_sink, n_window,
                                                             pos0, n, dkv);
}

void launch_kv_window_push(uint16_t *win, int *win_pos, const float *fresh, int pos0, int n, int n_window, int dkv,
                           cudaStream_t s) {
    if (n_window <= 0 || n <= 0) return;
    const int first = n > n_window ? n - n_window : 0;
    k_kv_window_push<<<nblk((size_t)(n - first) * dkv, 256), 256, 0, s>>>(win, win_pos, fresh, pos0, n, n_window, dkv);
}

/* ---- kv-rq rows encoded on the device, as kv_rq.c qf_kv_rq_encode / kv_rq_klt.c do ----
 * One block per (token, kv head) row: the parallel steps (centring, the Hadamard butterfly or
 * the format-3 projection, each coordinate's nearest level) over the threads, the sums thread
 * 0 runs in the host's order, every f32 and f64 operation rounded on its own, the scale code by
 * qf_kv_rq_scale_floor: the same bytes as the host encoder (test_cuda e2e_kv_rq). */
__device__ static inline double kv_dadd(double a, double b) { return __dadd_rn(a, b); }
__device__ static inline double kv_dmul(double a, double b) { return __dmul_rn(a, b); }

/* kv_rq.c qf_kv_rq_nearest: the first level whose upper decision boundary is >= v */
__device__ static inline int rq_nearest(const float *lv, int n, float v) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (v <= KV_MUL(0.5f, KV_ADD(lv[mid], lv[mid + 1]))) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

__device__ static inline int rq_scale_floor(float s) { return (int)floor(log2((double)s) * 8.0) + 128; }

__global__ void k_kv_rq_encode(rq_enc_dev a, const float *x, int64_t n_rows, int nkv, int hd) {
    __shared__ float y[HD_MAX];
    __shared__ uint8_t cd[HD_MAX], tc[HD_MAX];
    __shared__ float sh_s;
    __shared__ int sh_fin, sh_go, sh_sc;
    const int64_t r = blockIdx.x;
    if (r >= n_rows) return;
    const int h = (int)(r % nkv), tid = threadIdx.x, nt = blockDim.x;
    const size_t lh = (size_t)h * hd;
    const float *xr = x + (size_t)r * hd;
    uint8_t *row = a.dst + (size_t)r * a.rb, *cb = row + 1; /* QF_KV_RQ_SCALE_BYTES */
    if (a.bits == 16) { /* QF_KV_RQ_BITS_F16 */
        for (int i = tid; i < hd; i += nt) ((uint16_t *)row)[i] = f32_to_f16_bits(xr[i]);
        return;
    }
    if (tid == 0) sh_fin = 1;
    __syncthreads();
    const bool klt = a.encT != NULL;
    for (int i = tid; i < hd; i += nt) {
        const float d = KV_SUB(xr[i], a.mean[lh + i]);
        const float v = klt ? d : KV_MUL(d, a.inv_cs[lh + i]);
        y[i] = v;
        if (!isfinite(v)) sh_fin = 0;
    }
    __syncthreads();
    const bool fin = sh_fin != 0;
    if (!klt) {
        /* y = H((x - mean) inv_cs); s = rms(y); three passes: code, least-squares scale */
        if (fin) {
            for (int len = 1; len < hd; len <<= 1) {
                for (int q = tid; q < hd / 2; q += nt) {
                    const int i = (q / len) * 2 * len + q % len;
                    const float u = y[i], w = y[i + len];
                    y[i] = u + w;
                    y[i + len] = u - w;
                }
                __syncthreads();
            }
            for (int i = tid; i < hd; i += nt) y[i] = KV_MUL(y[i], a.hs);
            __syncthreads();
        }
        const int L = 1 << a.bits;
        const float *lv = a.levels + (size_t)h * 64;
        if (tid == 0) {
            double ss = 0;
            if (fin)
                for (int i = 0; i < hd; i++) ss = kv_dadd(ss, kv_dmul((double)y[i], (double)y[i]));
            const float s = fin ? __double2float_rn(__dsqrt_rn(__ddiv_rn(ss, (double)hd))) : 0.0f;
            sh_s = s, sh_go = s > 0 && isfinite(s);
        }
        __syncthreads();
        if (!sh_go) { /* a zero row: every code the level nearest 0, scale code 0 */
            const int z = rq_nearest(lv, L, 0.0f);
            for (int i = tid; i < hd; i += nt) cd[i] = (uint8_t)z;
            if (tid == 0) sh_sc = 0;
        } else {
            for (int it = 0; it < 3; it++) {
                const float inv = KV_DIV(1.0f, sh_s);
                for (int i = tid; i < hd; i += nt) cd[i] = (uint8_t)rq_nearest(lv, L, KV_MUL(y[i], inv));
                __syncthreads();
                if (tid == 0) {
                    double num = 0, den = 0;
                    for (int i = 0; i < hd; i++) {
                        const float l = lv[cd[i]];
                        num = kv_dadd(num, kv_dmul((double)y[i], (double)l));
                        den = kv_dadd(den, kv_dmul((double)l, (double)l));
                    }
                    if (it == 2 || !(den > 0) || !(num > 0)) sh_go = 0; /* the last pass only re-codes */
                    else sh_s = __double2float_rn(__ddiv_rn(num, den));
                }
                __syncthreads();
                if (!sh_go) break;
            }
            /* of the two scale codes around s, the one whose re-coded row errs least */
            const float s = sh_s;
            if (tid == 0) sh_sc = 0;
            if (s > 0) {
                const int c0 = rq_scale_floor(s);
                double best = INFINITY;
                for (int cand = c0; cand <= c0 + 1; cand++) {
                    const int cc = cand < 1 ? 1 : cand > 255 ? 255 : cand;
                    const float sv = a.scale[cc], inv = KV_DIV(1.0f, sv);
                    for (int i = tid; i < hd; i += nt) tc[i] = (uint8_t)rq_nearest(lv, L, KV_MUL(y[i], inv));
                    __syncthreads();
                    if (tid == 0) {
                        double e = 0;
                        for (int i = 0; i < hd; i++) {
                            const double d = (double)KV_SUB(y[i], KV_MUL(sv, lv[tc[i]]));
                            e = kv_dadd(e, kv_dmul(d, d));
                        }
                        if (e < best) {
                            best = e, sh_sc = cc;
                            for (int i = 0; i < hd; i++) cd[i] = tc[i];
                        }
                    }
                    __syncthreads();
                }
            }
        }
        __syncthreads();
        if (tid == 0) { /* qf_kv_rq_pack */
            const int bits = a.bits;
            const uint32_t mask = (1u << bits) - 1;
            for (int i = 0; i < hd * bits / 8; i++) cb[i] = 0;
            for (int i = 0; i < hd; i++) {
                const uint32_t b = (uint32_t)i * bits, v = cd[i] & mask;
                cb[b >> 3] |= (uint8_t)(v << (b & 7));
                if ((b & 7) + bits > 8) cb[(b >> 3) + 1] |= (uint8_t)(v >> (8 - (b & 7)));
            }
            row[0] = (uint8_t)sh_sc;
        }
        return;
    }
    /* format 3: z = enc (x - mean) / sigma; s = rms(z); two weighted least-squares passes; the
     * scale code whose re-coded row has the least weighted error */
    __shared__ float z[HD_MAX];
    if (fin)
        for (int i = tid; i < hd; i += nt) {
            const float *e = a.encT + lh * hd + i; /* enc[i][j] at e[j * hd] */
            double acc = 0;
            for (int j = 0; j < hd; j++) acc = kv_dadd(acc, kv_dmul((double)e[(size_t)j * hd], (double)y[j]));
            z[i] = __double2float_rn(__ddiv_rn(acc, (double)a.sigma[lh + i]));
        }
    __syncthreads();
    const uint8_t *wd = a.width + lh;
    const float *sg = a.sigma + lh, *kl = a.klevels + lh * 64;
    if (tid == 0) {
        double ss = 0;
        if (fin)
            for (int i = 0; i < hd; i++) ss = kv_dadd(ss, kv_dmul((double)z[i], (double)z[i]));
        const float s = fin && isfinite(ss) ? __double2float_rn(__dsqrt_rn(__ddiv_rn(ss, (double)hd))) : 0.0f;
        sh_s = s, sh_go = s > 0 && isfinite(s), sh_sc = 0;
    }
    __syncthreads();
    for (int i = tid; i < hd; i += nt) cd[i] = 0, tc[i] = 0;
    __syncthreads();
    if (sh_go) {
        for (int it = 0; it < 2; it++) {
            const float inv = KV_DIV(1.0f, sh_s);
            for (int i = tid; i < hd; i += nt)
                if (wd[i]) cd[i] = (uint8_t)rq_nearest(kl + (size_t)i * 64, 1 << wd[i], KV_MUL(z[i], inv));
            __syncthreads();
            if (tid == 0) {
                double num = 0, den = 0;
                for (int i = 0; i < hd; i++) {
                    if (!wd[i]) continue;
                    const double l = kl[(size_t)i * 64 + cd[i]], g2 = kv_dmul((double)sg[i], (double)sg[i]);
                    num = kv_dadd(num, kv_dmul(kv_dmul(g2, (double)z[i]), l));
                    den = kv_dadd(den, kv_dmul(kv_dmul(g2, l), l));
                }
                if (!(den > 0) || !(num > 0)) sh_go = 0;
                else sh_s = __double2float_rn(__ddiv_rn(num, den));
            }
            __syncthreads();
            if (!sh_go) break;
        }
        const int c0 = rq_scale_floor(sh_s);
        double best = INFINITY;
        for (int cand = c0; cand <= c0 + 1; cand++) {
            const int cc = cand < 1 ? 1 : cand > 255 ? 255 : cand;
            const float sv = a.scale[cc], inv = KV_DIV(1.0f, sv);
            for (int i = tid; i < hd; i += nt)
                if (wd[i]) tc[i] = (uint8_t)rq_nearest(kl + (size_t)i * 64, 1 << wd[i], KV_MUL(z[i], inv));
            __syncthreads();
            if (tid == 0) {
                double e = 0;
                for (int i = 0; i < hd; i++) {
                    if (!wd[i]) continue;
                    const double d = (double)KV_SUB(z[i], KV_MUL(sv, kl[(size_t)i * 64 + tc[i]])), g = sg[i];
                    e = kv_dadd(e, kv_dmul(kv_dmul(kv_dmul(g, g), d), d));
                }
                if (e < best) {
                    best = e, sh_sc = cc;
                    for (int i = 0; i < hd; i++) cd[i] = tc[i];
                }
            }
            __syncthreads();
        }
    }
    __syncthreads();
    if (!sh_sc) /* zero row: every coded coordinate at its level nearest 0 */
        for (int i = tid; i < hd; i += nt) cd[i] = wd[i] ? (uint8_t)rq_nearest(kl + (size_t)i * 64, 1 << wd[i], 0.0f) : 0;
    __syncthreads();
    if (tid == 0) { /* qf_kv_rq_klt_pack */
        uint32_t nb = 0;
        for (int i = 0; i < hd; i++) nb += wd[i];
        for (uint32_t i = 0; i < (nb + 7) / 8; i++) cb[i] = 0;
        uint32_t b = 0;
        for (int i = 0; i < hd; i++) {
            const int w = wd[i];
            if (!w) continue;
            const uint32_t v = cd[i] & ((1u << w) - 1);
            cb[b >> 3] |= (uint8_t)(v << (b & 7));
            if ((b & 7) + w > 8) cb[(b >> 3) + 1] |= (uint8_t)(v >> (8 - (b & 7)));
            b += (uint32_t)w;
        }
        row[0] = (uint8_t)sh_sc;
    }
}

/* V minus its prediction from the token's decoded pre-RoPE K rows (kv_cache.c rq_predict):
 * res[t][o] = v[t][o] - sum_i P[o][i] khat[t][i], the sum in f32 in i's order */
__global__ void k_kv_rq_vres(const float *v, const float *khat, const float *predT, int n, int HD, float *res) {
    const int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= (int64_t)n * HD) return;
    const int t = (int)(w / HD), o = (int)(w % HD);
    const float *kh = khat + (size_t)t * HD;
    float acc = 0.0f;
    for (int i = 0; i < HD; i++) acc = KV_ADD(acc, KV_MUL(predT[(size_t)i * HD + o], kh[i]));
    res[w] = KV_SUB(v[w], acc);
}

void launch_kv_rq_encode(const rq_enc_dev *a, const float *x, int64_t n_rows, int nkv, int hd, cudaStream_t s) {
    if (n_rows <= 0) return;
    k_kv_rq_encode<<<(unsigned)n_rows, hd < 128 ? 64 : 128, 0, s>>>(*a, x, n_rows, nkv, hd);
}

/* one thread per element, src read in order; the one-time uploads of rq_state_new */
__global__ void k_transpose_sq(const float *__restrict__ src, float *__restrict__ dst, int n, size_t total) {
    const size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (t >= total) return;
    const size_t nn = (size_t)n * n, b = t / nn, r = t % nn, i = r / (size_t)n, j = r % (size_t)n;
    dst[b * nn + j * (size_t)n + i] = src[t];
}

void launch_transpose_sq(const float *src, size_t nb, int n, float *dst, cudaStream_t s) {
    const size_t total = nb * (size_t)n * (size_t)n;
    if (!total) return;
    k_transpose_sq<<<nblk(total, 256), 256, 0, s>>>(src, dst, n, total);
}

void launch_kv_rq_vres(const float *v, const float *khat, const float *predT, int n, int HD, float *res, cudaStream_t s) {
    if (n <= 0) return;
    k_kv_rq_vres<<<nblk((size_t)n * HD, 256), 256, 0, s>>>(v, khat, predT, n, HD, res);
}
