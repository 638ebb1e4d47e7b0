/* cuda_ops.cu: single operations for tests/test_cuda.c (cuda_ops.h), each running the kernel the
 * forward pass runs on uploaded inputs. */
#include "kernels/cuda/cuda_common.cuh"

/* ---------------------------------------------------------------------------------------- */
/* single operations for the tests                                                           */

/* a weight on the device as the context uploads it: q4_0 of width % 256 == 0 regrouped (G8) */
static dweight dup_weight(dallocs *a, const qf_weight *w) {
    dweight dw = {w->type, w->ne0, w->ne1, w->row_bytes, NULL};
    dw.g8 = g8_ok(w->type, w->ne0);
    uint8_t *d = (uint8_t *)dalloc(a, w->row_bytes * (size_t)w->ne1);
    cudaError_t e;
    if (d && h2d_weight(d, w->data, w->type, w->ne0, w->ne1, w->row_bytes, dw.g8, &e)) dw.d = d;
    return dw;
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
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: device allocation failed"); \
    }

qf_status op_dequant(qf_type t, const void *src, size_t rb, int64_t rows, int64_t k, float *dst, qf_error *err) {
    if (!gpu_type_ok(t) || k % 32) return cu_fail(err, QF_ERR_DEVICE, "CUDA op: type %d not supported", (int)t);
    dallocs a = {};
    dweight w = {t, k, rows, rb, (uint8_t *)dup_to(&a, src, rb * rows)};
    float *out = (float *)dalloc(&a, (size_t)rows * k * 4);
    OP_NEED(w.d && out);
    launch_dequant(&w, out, true, 0);
    return op_finish(&a, dst, out, (size_t)rows * k * 4, err);
}

qf_status op_matmul(const qf_weight *w, const float *x, int n, float *y, int route, qf_error *err) {
    if (!gpu_type_ok(w->type)) return cu_fail(err, QF_ERR_DEVICE, "CUDA op: type %d not supported", (int)w->type);
    static cublasHandle_t blas;
    if (!blas && cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return cu_fail(err, QF_ERR_DEVICE, "cublasCreate failed");
    dallocs a = {};
    const size_t K = (size_t)w->ne0, N = (size_t)w->ne1;
    dweight dw = dup_weight(&a, w);
    float *dx = (float *)dup_to(&a, x, (size_t)n * K * 4);
    float *dy = (float *)dalloc(&a, (size_t)n * N * 4);
    void *wdeq = dalloc(&a, N * K * 4);
    __half *xh = (__half *)dalloc(&a, (size_t)n * K * 2);
    OP_NEED(dw.d && dx && dy && wdeq && xh);
    qf_status st = route == MM_CANON ? canon_matmul(&dw, dx, n, dy, xh, 0, err)
                                     : dev_matmul(blas, &dw, dx, n, dy, false, route, wdeq, xh, 0, err);
    if (st) {
        dfree(&a);
        return st;
    }
    return op_finish(&a, y, dy, (size_t)n * N * 4, err);
}

qf_status op_matvec_gu(const qf_weight *w, const float *x, int n, int F, float *hb, qf_error *err) {
    dallocs a = {};
    const size_t K = (size_t)w->ne0;
    dweight dw = dup_weight(&a, w);
    float *dx = (float *)dup_to(&a, x, (size_t)n * K * 4), *dh = (float *)dalloc(&a, (size_t)n * F * 4);
    void *xq = dalloc(&a, (size_t)n * K * 2);
    OP_NEED(dw.d && dx && dh && xq);
    if (!launch_matvec_gu(&dw, dx, n, F, dh, xq, 0)) {
        dfree(&a);
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: the fused gate|up kernel does not apply here");
    }
    return op_finish(&a, hb, dh, (size_t)n * F * 4, err);
}

qf_status op_rmsnorm(const float *x, const float *gn, int n, int d, float eps, float *out, int act, void *xq,
                     void *xq_ref, qf_error *err) {
    if (act < 0 || act > 1) return cu_fail(err, QF_ERR_DEVICE, "CUDA op: activation kind %d not supported", act);
    dallocs a = {};
    const size_t qb = ACT_Q_BYTES(n, d);
    float *dx = (float *)dup_to(&a, x, (size_t)n * d * 4), *dg = (float *)dup_to(&a, gn, (size_t)d * 4);
    float *dout = (float *)dalloc(&a, (size_t)n * d * 4);
    void *dq = act ? dalloc(&a, qb) : NULL, *dr = act ? dalloc(&a, qb) : NULL;
    OP_NEED(dx && dg && dout && (!act || (dq && dr)));
    if (act && (cudaMemset(dq, 0xA5, qb) != cudaSuccess || cudaMemset(dr, 0xA5, qb) != cudaSuccess)) {
        dfree(&a);
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: memset failed");
    }
    if (!launch_rmsnorm(dx, dg, n, d, eps, dout, NULL, 0, dq) && act) {
        dfree(&a);
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: the norm does not write this activation (n %d, d %d)", n, d);
    }
    if (act) launch_quant_act(dout, n, d, dr, 0);
    if (act && (cudaMemcpy(xq, dq, qb, cudaMemcpyDeviceToHost) != cudaSuccess ||
                cudaMemcpy(xq_ref, dr, qb, cudaMemcpyDeviceToHost) != cudaSuccess)) {
        dfree(&a);
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: copy failed");
    }
    return op_finish(&a, out, dout, (size_t)n * d * 4, err);
}

qf_status op_rope(float *v, int n, int n_heads, int head_dim, int n_rot, qf_rope_type type,
                                     const float *cs, const float *sn, qf_error *err) {
    dallocs a = {};
    const int half = n_rot / 2;
    size_t bytes = (size_t)n * n_heads * head_dim * 4;
    float *dv = (float *)dup_to(&a, v, bytes);
    float *dc = (float *)dup_to(&a, cs, (size_t)n * half * 4), *ds = (float *)dup_to(&a, sn, (size_t)n * half * 4);
    OP_NEED(dv && dc && ds);
    launch_rope(dv, n, n_heads, head_dim, half, type == QF_ROPE_NEOX, dc, ds, 0);
    return op_finish(&a, v, dv, bytes, err);
}

qf_status op_silu_mul(const float *gt, const float *u, size_t n, float *out, qf_error *err) {
    dallocs a = {};
    float *dg = (float *)dup_to(&a, gt, n * 4), *du = (float *)dup_to(&a, u, n * 4);
    OP_NEED(dg && du);
    launch_silu_mul(dg, du, n, 0);
    return op_finish(&a, out, dg, n * 4, err);
}

qf_status op_topk(const float *logits, int V, float temp, int k, qf_gpu_topk *out, qf_error *err) {
    if (V <= 0 || k < 0 || k > QF_GPU_TOPK_MAX) return cu_fail(err, QF_ERR_ARG, "op_topk: V %d, k %d", V, k);
    dallocs a = {};
    float *dl = (float *)dup_to(&a, logits, (size_t)V * 4);
    qf_gpu_topk *dout = (qf_gpu_topk *)dalloc(&a, sizeof *out);
    void *scr = dalloc(&a, topk_scratch_bytes(V));
    OP_NEED(dl && dout && scr);
    launch_topk(dl, V, temp, k, dout, scr, 0);
    return op_finish(&a, out, dout, sizeof *out, err);
}

/* route 3 of op_attention: one token's decode attention over an f16, q8_0 or q4_0 cache in the
 * decode step's fused form (attn_fuse: the q|k|v split and the o activation's quantization folded
 * into the attention) against the separate launches (k_qkv_split kind 2, or for q8_0 / q4_0 kind
 * 0 and the K|V write; the attention; k_quant_act),
 * on the same q|k|v row: [q | k row pos0 | v row pos0], with biases where pos0 % 3 == 0, NEOX
 * pairs where pos0 is odd and a RoPE row of cos / sin(0.37 (j + 1)). The cache rows, the output
 * and the q8_0 activation must be the same bytes (else QF_ERR_DEVICE saying which); out gets the
 * fused output (rotated q and K row pos0: not plain attention of q, k, v). rot (route 4): with
 * --kv-rot hadamard folded into k_attn_one, against the f32 split, one k_hadamard launch over K,
 * V and q, the K|V write, the attention, k_hadamard over its output and k_quant_act (the decode
 * step's separate launches under --kv-rot). Past k_attn_one's keys, for q8_0 / q4_0 or under
 * rot, the split stores (and rotates) the rows itself (launch_qkv_split_store) and split-K's
 * merge rotates the output back and quantizes it, as in the step. The rows before pos0 are
 * stored unrotated (any rows will do: both sides read the same). */
static qf_status op_attention_fused(const float *q, const float *k, const float *v, int pos0, int n_head, int n_head_kv,
                                    int hd, qf_kv_mode mode, bool rot, float *out, qf_error *err) {
    const size_t rb = kv_row_bytes(mode, hd), rows = (size_t)(pos0 + 1) * n_head_kv, Dq = (size_t)n_head * hd,
                 Dkv = (size_t)n_head_kv * hd, H = Dq + 2 * Dkv, xqb = ACT_Q_BYTES(1, (int)Dq);
    const int half = hd / 2, neox = pos0 % 2;
    if (hd % 32 || hd > HD_MAX) return cu_fail(err, QF_ERR_DEVICE, "CUDA op: fused split-K attention needs hd %% 32 == 0");
    if (rot && (hd & (hd - 1))) return cu_fail(err, QF_ERR_DEVICE, "CUDA op: --kv-rot needs a power-of-two head_dim");
    /* only k_attn_one folds q8_0 / q4_0 or the rotation's split; past it the split stores the
     * rows itself (launch_qkv_split_store) and split-K's merge rotates the output back, as in
     * the step */
    const bool one = attention_one_keys(mode, mode, hd) >= pos0 + 1, store = !one && (mode != QF_KV_F16 || rot);
    float *hq = (float *)malloc(H * 4), *tab = (float *)malloc((size_t)hd * 4), *bias = (float *)malloc(H * 4);
    uint8_t *hb[3] = {(uint8_t *)malloc(rows * rb), (uint8_t *)malloc(rows * rb), (uint8_t *)malloc(xqb)};
    uint8_t *hf[3] = {(uint8_t *)malloc(rows * rb), (uint8_t *)malloc(rows * rb), (uint8_t *)malloc(xqb)};
    float *o1 = (float *)malloc(Dq * 4);
    qf_status st = QF_OK;
    dallocs a = {};
    if (!hq || !tab || !bias || !hb[0] || !hb[1] || !hb[2] || !hf[0] || !hf[1] || !hf[2] || !o1) {
        st = cu_fail(err, QF_ERR_DEVICE, "CUDA op: out of host memory");
        goto out;
    }
    memcpy(hq, q, Dq * 4), memcpy(hq + Dq, k + (size_t)pos0 * Dkv, Dkv * 4), memcpy(hq + Dq + Dkv, v + (size_t)pos0 * Dkv, Dkv * 4);
    for (int j = 0; j < half; j++) tab[j] = cosf(0.37f * (float)(j + 1)), tab[half + j] = sinf(0.37f * (float)(j + 1));
    for (size_t i = 0; i < H; i++) bias[i] = 0.01f * (float)((int)(i % 23) - 11);
    {
        float *dk = (float *)dup_to(&a, k, rows * hd * 4), *dv = (float *)dup_to(&a, v, rows * hd * 4);
        float *dqkv = (float *)dup_to(&a, hq, H * 4), *dtab = (float *)dup_to(&a, tab, (size_t)hd * 4);
        float *db = pos0 % 3 == 0 ? (float *)dup_to(&a, bias, H * 4) : NULL;
        uint8_t *c[2][2], *xq[2];
        float *o[2], *dq = (float *)dalloc(&a, Dq * 4), *dq2 = (float *)dalloc(&a, Dq * 4);
        float *part = (float *)dalloc(&a, attention_split_floats(1, n_head, hd) * 4);
        bool ok = dk && dv && dqkv && dtab && (db || pos0 % 3) && dq && dq2 && part;
        for (int r = 0; r < 2; r++) {
            c[r][0] = (uint8_t *)dalloc(&a, rows * rb), c[r][1] = (uint8_t *)dalloc(&a, rows * rb);
            xq[r] = (uint8_t *)dalloc(&a, xqb), o[r] = (float *)dalloc(&a, Dq * 4);
            ok = ok && c[r][0] && c[r][1] && xq[r] && o[r];
        }
        if (!ok) {
            dfree(&a);
            st = cu_fail(err, QF_ERR_DEVICE, "CUDA op: device allocation failed");
            goto out;
        }
        for (int r = 0; r < 2; r++) { /* rows 0 .. pos0 - 1 from k, v; row pos0 left zero for the split */
            cudaMemset(c[r][0], 0, rows * rb), cudaMemset(c[r][1], 0, rows * rb);
            launch_kv_write(mode, dk, (int64_t)pos0 * n_head_kv, hd, rb, c[r][0], 0);
            launch_kv_write(mode, dv, (int64_t)pos0 * n_head_kv, hd, rb, c[r][1], 0);
        }
        attn_fuse fx = {dqkv, dtab, dtab + half, db, db ? db + Dq : NULL, db ? db + Dq + Dkv : NULL, half, neox, NULL};
        /* separate: the split (a quantized cache's: in f32 into row pos0 of dk / dv, whose rows
         * before it are in the cache already, then the K|V write), the attention, the
         * quantization */
        uint8_t *k0 = c[0][0] + (size_t)pos0 * n_head_kv * rb, *v0 = c[0][1] + (size_t)pos0 * n_head_kv * rb;
        if (rot) fx.rot = 1.0f / sqrtf((float)hd); /* as qf_hadamard computes it */
        if (mode == QF_KV_F16 && !rot)
            launch_qkv_split(dqkv, 2, 1, n_head, n_head_kv, hd, half, neox != 0, fx.cs, fx.sn, fx.bq, fx.bk, fx.bv, dq, k0,
                             v0, 0);
        else {
            float *kr = dk + (size_t)pos0 * Dkv, *vr = dv + (size_t)pos0 * Dkv;
            launch_qkv_split(dqkv, 0, 1, n_head, n_head_kv, hd, half, neox != 0, fx.cs, fx.sn, fx.bq, fx.bk, fx.bv, dq, kr,
                             vr, 0);
            if (rot) {
                float *rx[3] = {kr, vr, dq};
                const int64_t rr[3] = {n_head_kv, n_head_kv, n_head};
                launch_hadamard_n(rx, rr, 3, hd, 0);
            }
            launch_kv_write(mode, kr, n_head_kv, hd, rb, k0, 0);
            launch_kv_write(mode, vr, n_head_kv, hd, rb, v0, 0);
        }
        launch_attention_split(mode, mode, dq, c[0][0], c[0][1], rb, rb, 1, pos0, n_head, n_head_kv, hd, o[0], part, 0,
                               NULL, 0, true);
        if (rot) launch_hadamard(o[0], n_head, hd, 0);
        launch_quant_act(o[0], 1, (int)Dq, xq[0], 0);
        /* fused */
        fx.xq = xq[1];
        if (store) { /* split-K: the split storing row pos0 (and rotating), the merge rotating back */
            const kv_rows kr = {{c[1][0], c[1][1]}, {(int)mode, (int)mode}, {rb, rb}};
            launch_qkv_split_store(dqkv, 1, n_head, n_head_kv, hd, half, neox != 0, fx.cs, fx.sn, fx.bq, fx.bk, fx.bv, dq2,
                                   kr, fx.rot, pos0, 0);
            fx.qkv = NULL;
        }
        if (!launch_attention_split(mode, mode, store ? dq2 : dq, c[1][0], c[1][1], rb, rb, 1, pos0, n_head, n_head_kv, hd,
                                    o[1], part, 0, NULL, 0, true, &fx)) {
            dfree(&a);
            st = cu_fail(err, QF_ERR_DEVICE, "CUDA op: the merge did not write the q8_0 activation");
            goto out;
        }
        cudaError_t e = cudaGetLastError();
        uint8_t **hs[2] = {hb, hf};
        for (int r = 0; r < 2 && e == cudaSuccess; r++) {
            e = cudaMemcpy(hs[r][0], c[r][0], rows * rb, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess) e = cudaMemcpy(hs[r][1], c[r][1], rows * rb, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess) e = cudaMemcpy(hs[r][2], xq[r], xqb, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess) e = cudaMemcpy(r ? out : o1, o[r], Dq * 4, cudaMemcpyDeviceToHost);
        }
        dfree(&a);
        if (e != cudaSuccess) {
            st = cuda_fail(err, e, "test op");
            goto out;
        }
    }
    {
        const char *what = memcmp(hb[0], hf[0], rows * rb)   ? "K cache rows"
                           : memcmp(hb[1], hf[1], rows * rb) ? "V cache rows"
                           : memcmp(o1, out, Dq * 4)         ? "attention output"
                           : memcmp(hb[2], hf[2], xqb)       ? "q8_0 activation"
                                                             : NULL;
        if (what)
            st = cu_fail(err, QF_ERR_DEVICE, "CUDA op: fused %s attention%s: the %s differ from the separate launches'",
                         cu_kv_mode_name(mode), rot ? " with --kv-rot" : "", what);
    }
out:
    free(hq), free(tab), free(bias), free(o1);
    for (int r = 0; r < 3; r++) free(hb[r]), free(hf[r]);
    return st;
}

qf_status op_attention(const float *q, const float *k, const float *v, int n, int pos0, int n_head, int n_head_kv,
                       int hd, qf_kv_mode mode, int route, float *out, qf_error *err) {
    if (route == 3 || route == 4) {
        if (n != 1 || !(mode == QF_KV_F16 || mode == QF_KV_Q8_0 || mode == QF_KV_Q4_0))
            return cu_fail(err, QF_ERR_DEVICE, "CUDA op: the fused route is one token, f16, q8_0 or q4_0 cache");
        return op_attention_fused(q, k, v, pos0, n_head, n_head_kv, hd, mode, route == 4, out, err);
    }
    const bool flash = route == 1, split = route == 2;
    size_t rb = kv_row_bytes(mode, hd);
    if (flash && !flash_ok(mode, mode, hd))
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: flash attention needs an f32, f16, q8_0 or q4_0 cache and head_dim <= 256");
    if (!rb || hd > HD_MAX) return cu_fail(err, QF_ERR_DEVICE, "CUDA op: kv mode %s / head_dim %d not supported", cu_kv_mode_name(mode), hd);
    dallocs a = {};
    const int T = pos0 + n;
    const size_t rows = (size_t)T * n_head_kv;
    float *dq = (float *)dup_to(&a, q, (size_t)n * n_head * hd * 4);
    float *dk = (float *)dup_to(&a, k, rows * hd * 4), *dv = (float *)dup_to(&a, v, rows * hd * 4);
    uint8_t *ck = (uint8_t *)dalloc(&a, rows * rb), *cv = (uint8_t *)dalloc(&a, rows * rb);
    float *dout = (float *)dalloc(&a, (size_t)n * n_head * hd * 4);
    float *part = split ? (float *)dalloc(&a, attention_split_floats(n, n_head, hd) * 4) : NULL;
    OP_NEED(dq && dk && dv && ck && cv && dout && (!split || part));
    launch_kv_write(mode, dk, (int64_t)rows, hd, rb, ck, 0);
    launch_kv_write(mode, dv, (int64_t)rows, hd, rb, cv, 0);
    /* flash: the kernel reads the f32 / q8_0 / q4_0 rows itself, as the prefill does */
    if (split) launch_attention_split(mode, mode, dq, ck, cv, rb, rb, n, pos0, n_head, n_head_kv, hd, dout, part, 0, NULL, 0, true);
    else launch_attention(mode, mode, dq, ck, cv, rb, rb, n, pos0, n_head, n_head_kv, hd, dout, flash, NULL, NULL, 0);
    return op_finish(&a, out, dout, (size_t)n * n_head * hd * 4, err);
}

qf_status op_kv_roundtrip(qf_kv_mode mode, qf_kv_rot rot, const float *x, int64_t rows, int hd, void *bytes, float *out,
                          qf_error *err) {
    size_t rb = kv_row_bytes(mode, hd);
    if (!rb) return cu_fail(err, QF_ERR_DEVICE, "CUDA op: kv mode %s not supported", cu_kv_mode_name(mode));
    if (rot == QF_KV_ROT_HADAMARD && (hd & (hd - 1) || hd > HD_MAX))
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: --kv-rot hadamard needs a power-of-two head_dim <= %d", HD_MAX);
    dallocs a = {};
    float *dx = (float *)dup_to(&a, x, (size_t)rows * hd * 4), *dout = (float *)dalloc(&a, (size_t)rows * hd * 4);
    uint8_t *c = (uint8_t *)dalloc(&a, rows * rb), *c2 = (uint8_t *)dalloc(&a, rows * rb);
    OP_NEED(dx && dout && c && c2);
    /* the forward pass's order: rotate the rows, store them; read, rotate back. The rows are
     * stored twice, by the one-stream kernel and as the V half of the K|V kernel the decode
     * step runs (its K half an f32 copy), which must store the same bytes */
    if (rot == QF_KV_ROT_HADAMARD) launch_hadamard(dx, rows, hd, 0);
    launch_kv_write(mode, dx, rows, hd, rb, c, 0);
    {
        const qf_kv_mode m2[2] = {QF_KV_F32, mode};
        const float *src[2] = {dx, dx};
        const size_t rb2[2] = {(size_t)hd * 4, rb};
        uint8_t *dst[2] = {(uint8_t *)dout, c2};
        launch_kv_write2(m2, src, rows, hd, rb2, dst, 0, NULL, NULL);
    }
    launch_kv_read(mode, c, rows, hd, rb, dout, 0);
    if (rot == QF_KV_ROT_HADAMARD) launch_hadamard(dout, rows, hd, 0);
    uint8_t *h2 = (uint8_t *)malloc(rows * rb);
    if (!h2 || cudaMemcpy(bytes, c, rows * rb, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(h2, c2, rows * rb, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h2);
        dfree(&a);
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: copy failed");
    }
    const bool same = memcmp(h2, bytes, rows * rb) == 0;
    free(h2);
    if (!same) {
        dfree(&a);
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: the K|V write stored other bytes than the one-stream write");
    }
    return op_finish(&a, out, dout, (size_t)rows * hd * 4, err);
}

qf_status op_kv_int8_roundtrip(const float *x, int64_t rows, int dkv, int hd, int layout, const float *scale,
                               const float *inv, int8_t *bytes, float *out, qf_error *err) {
    if (layout < 0 || layout > 4 || hd <= 0 || hd > HD_MAX || dkv % hd || (layout && (hd & (hd - 1)) && layout != 3) ||
        (layout == 4 && (kv_ec_group(dkv / hd, hd) * hd < 16 || hd % 4)))
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: int8 layout %d with head_dim %d not supported", layout, hd);
    dallocs a = {};
    const size_t n = (size_t)rows * dkv;
    float steps[KV_STEPS_N];
    kv_tok_steps(steps);
    float *dx = (float *)dup_to(&a, x, n * 4), *ds = (float *)dup_to(&a, scale, (size_t)dkv * 4),
          *di = (float *)dup_to(&a, inv, (size_t)dkv * 4), *dout = (float *)dalloc(&a, n * 4),
          *dst = (float *)dup_to(&a, steps, sizeof steps);
    int8_t *c = (int8_t *)dalloc(&a, n);
    const size_t ipp = layout == 4 ? kv_ec_index_per_pos(dkv / hd, hd) : 0; /* ec-rot's index entries a row */
    uint16_t *ix = ipp ? (uint16_t *)dalloc(&a, (size_t)rows * ipp * 2) : NULL;
    OP_NEED(dx && ds && di && dout && c && dst && (ix || !ipp));
    kv8_io io = {};
    io.src = dx, io.dst = c, io.ix = ix, io.eix = ix, io.inv = di, io.scale = ds, io.codes = c, io.out = dout;
    launch_kv_int8_write(layout, &io, 1, rows, dkv / hd, hd, dst, 0, NULL, 0, true);
    launch_kv_int8_expand(layout, &io, 1, rows, dkv / hd, hd, dst, 0, NULL, true, false);
    if (cudaMemcpy(bytes, c, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        dfree(&a);
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: copy failed");
    }
    return op_finish(&a, out, dout, n * 4, err);
}

qf_status op_kv_dict_encode(const float *x, int64_t rows, int hd, const float *atoms, const float *gram, int n_atoms,
                            int sparsity, int coef_q8, size_t rb, qf_gpu_dict_omp omp, uint8_t *codes, qf_error *err) {
    dallocs a = {};
    float *dx = (float *)dup_to(&a, x, (size_t)rows * hd * 4), *da = (float *)dup_to(&a, atoms, (size_t)n_atoms * hd * 4),
          *dg = (float *)dup_to(&a, gram, (size_t)n_atoms * n_atoms * 4);
    uint8_t *dc = (uint8_t *)dalloc(&a, (size_t)rows * rb);
    OP_NEED(dx && da && dg && dc);
    if (!launch_kv_dict_encode(dx, rows, hd, da, dg, n_atoms, sparsity, coef_q8, rb, dc, omp, 0)) {
        dfree(&a);
        return cu_fail(err, QF_ERR_DEVICE, "CUDA op: the dict encoder's scratch does not fit (%d atoms, sparsity %d)",
                       n_atoms, sparsity);
    }
    return op_finish(&a, codes, dc, (size_t)rows * rb, err);
}

qf_status op_kv_dict_decode(const uint8_t *codes, int64_t rows, int hd, size_t rb, const float *atoms,
                                               int n_atoms, int sparsity, int coef_q8, float *out, qf_error *err) {
    dallocs a = {};
    uint8_t *dc = (uint8_t *)dup_to(&a, codes, (size_t)rows * rb);
    float *da = (float *)dup_to(&a, atoms, (size_t)n_atoms * hd * 4), *dout = (float *)dalloc(&a, (size_t)rows * hd * 4);
    OP_NEED(dc && da && dout);
    launch_kv_expand_dict(dc, rows, hd, rb, da, n_atoms, sparsity, coef_q8, dout, 0);
    return op_finish(&a, out, dout, (size_t)rows * hd * 4, err);
}

