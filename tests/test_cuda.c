/* test_cuda.c: the CUDA backend certified against the CPU engine.
 *
 * Per operation (as ggml's test-backend-ops): each GPU kernel against the CPU scalar oracle on
 * random inputs, with a normalized-MSE bound per op (sum (gpu-cpu)^2 / sum cpu^2).
 * End to end: GPU vs CPU logits and captured K/V on the real demo models (prefill + decode),
 * and perplexity on the kerneldoc-demo corpus within 0.1% of the CPU route with the same KV
 * cache type. Everything GPU-side SKIPs with a message when no GPU answers; the device
 * selection (cuda refused with QF_ERR_DEVICE, auto falls back to the CPU) runs everywhere. */
#include <stdint.h>
#include <unistd.h>

#include "qforge/artifact.h"
#include "qforge/artifact_bind.h"
#include "qforge/forge.h"
#include "qforge/kvlearn.h"
#include "qforge/kv_rq.h"
#include "qforge/model.h"
#include "qforge/ppl.h"
#include "qforge/quant.h"
#include "test.h"
#include "util/util.h"
#include "engine/gpu.h"
#include "engine/kv_codes.h"
#include "format/quant_blocks.h"
#include "kernels/cuda/cuda_forge.h"
#include "kernels/cuda/cuda_ops.h"
#include "forge/awq_impl.h"
#include "qforge/awq.h"
#include "qforge/tokenizer.h"
#include "qforge/run.h"
#include "engine/sample.h"
#include "kernels/hadamard.h"
#include "kernels/canon_cpu.h"
#include "kernels/gemm.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static __attribute__((unused)) float frand(void) { /* uniform [-1, 1) */
    return (float)qf_rand_unit(&rng) * 2.0f - 1.0f;
}

static __attribute__((unused)) double nmse(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (!isfinite(got[i])) return INFINITY;
    }
    return den > 0 ? num / den : num;
}

static const char *model_path(const char *name) {
    const char *p = test_data(name);
    if (!p && strcmp(name, "models/qforge-demo-11m-f16.gguf") == 0 &&
        access("assets/models/qforge-demo-11m-f16.gguf", R_OK) == 0)
        p = "assets/models/qforge-demo-11m-f16.gguf";
    return p;
}

/* ---- runs everywhere: device selection ---- */

TEST(device_selection) {
    const char *path = model_path("models/qforge-demo-11m-f16.gguf");
    if (!path) SKIP("demo model not found");
    qf_error err = {0};
    qf_model *m = qf_model_load(path, &err);
    CHECK(m);
    if (!m) return;
    qf_context_params p = qf_context_default_params();
    p.n_ctx = 64;
    p.device = QF_DEVICE_AUTO;
    qf_context *c = qf_context_new(m, &p, &err);
    CHECK(c);
    if (c) CHECK_EQ_INT(qf_context_device(c), qf_cuda_available() ? QF_DEVICE_CUDA : QF_DEVICE_CPU);
    qf_context_free(c);
    if (!qf_cuda_available()) {
        p.device = QF_DEVICE_CUDA;
        c = qf_context_new(m, &p, &err);
        CHECK(!c);
        CHECK_EQ_INT(err.code, QF_ERR_DEVICE);
        printf("  --device cuda without a GPU: %s\n", err.msg);
        qf_context_free(c);
    }
    qf_model_free(m);
}

#define NEED_GPU()                                                                                        \
    do {                                                                                                  \
        if (!qf_cuda_available()) SKIP("no CUDA GPU on this machine, or no CUDA backend (libqforge-cuda.so)"); \
    } while (0)

static const qf_type all_types[] = {QF_TYPE_F32,  QF_TYPE_F16,  QF_TYPE_BF16, QF_TYPE_Q4_0, QF_TYPE_Q5_0,
                                    QF_TYPE_Q8_0, QF_TYPE_Q4_K, QF_TYPE_Q5_K, QF_TYPE_Q6_K};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

/* rows x k of type t: quantized from random floats where we have a quantizer, else random
 * bytes with sane f16 super-block scales (the K formats) */
static void *rand_weight(qf_type t, int64_t rows, int64_t k) {
    size_t rb = qf_row_bytes(t, k);
    uint8_t *buf = malloc(rb * rows);
    float *src = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < k; i++) src[i] = frand() * 0.5f;
        uint8_t *row = buf + (size_t)r * rb;
        if (qf_quantize_row_ref(t, src, row, k)) continue;
        for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)(frand() * 128 + 128);
        size_t bb = qf_type_block_bytes(t);
        for (size_t b = 0; b < rb / bb; b++) {
            uint8_t *p = row + b * bb;
            uint16_t h = (uint16_t)(0x1C00 + ((uint16_t)(frand() * 100 + 100))); /* ~0.004 */
            /* d (and dmin) little-endian where the block layout puts them (format/quant_blocks.h) */
            const size_t at = t == QF_TYPE_Q6_K ? offsetof(block_q6_K, d) : offsetof(block_q4_K, d);
            p[at] = h & 0xFF, p[at + 1] = h >> 8;
            if (t != QF_TYPE_Q6_K) /* Q4_K / Q5_K: dmin follows d */
                p[offsetof(block_q4_K, dmin)] = h & 0xFF, p[offsetof(block_q4_K, dmin) + 1] = h >> 8;
        }
    }
    free(src);
    return buf;
}

TEST(op_dequant) {
    NEED_GPU();
    for (size_t ti = 0; ti < 2 * N_TYPES; ti++) { /* k 2048: Q6_K in its G8 layout too */
        qf_type t = all_types[ti % N_TYPES];
        int64_t rows = 37, k = ti < N_TYPES ? 512 : 2048;
        void *w = rand_weight(t, rows, k);
        float *ref = malloc(rows * k * 4), *got = malloc(rows * k * 4);
        for (int64_t r = 0; r < rows; r++)
            qf_dequantize_row_ref(t, (uint8_t *)w + r * qf_row_bytes(t, k), ref + r * k, k);
        qf_error err = {0};
        CHECK_MSG(qf_cuda_op_dequant(t, w, rows, k, got, &err) == QF_OK, "%s", err.msg);
        double e = nmse(got, ref, rows * k);
        printf("  dequant %-5s k %4d nmse %.3g\n", qf_type_name(t), (int)k, e);
        CHECK_MSG(e <= 1e-12, "dequant %s nmse %g", qf_type_name(t), e);
        free(w), free(ref), free(got);
    }
}

/* The decode (matvec) route of q4_0 / q8_0 and of the K formats quantizes the activation to
 * qf_vec_dot_type (q8_0, or Q8_K: one scale per 256) and takes integer dot products, as the
 * CPU's vec_dot route does: its oracle is qf_vec_dot_ref on qf_quantize_row_ref(that type, x).
 * Every other type's oracle is the f32 dot (in double). */
static bool mv_int8(qf_type t) {
    return t == QF_TYPE_Q4_0 || t == QF_TYPE_Q8_0 || t == QF_TYPE_Q4_K || t == QF_TYPE_Q5_K || t == QF_TYPE_Q6_K;
}
static void vec_dot_oracle(qf_type t, const void *w, int K, int N, const float *x, int n, float *ref) {
    const qf_type vt = qf_vec_dot_type(t);
    const size_t rb = qf_row_bytes(t, K), qb = qf_row_bytes(vt, K);
    uint8_t *xq = malloc(qb);
    for (int tt = 0; tt < n; tt++) {
        qf_quantize_row_ref(vt, x + (size_t)tt * K, xq, K);
        for (int r = 0; r < N; r++) ref[(size_t)tt * N + r] = qf_vec_dot_ref(t, K, (const uint8_t *)w + (size_t)r * rb, xq);
    }
    free(xq);
}

/* K = 512: one partial tile of the wide decode kernel; K = 2304: a whole tile and a partial
 * one (q6_K rows of these sizes are not 8-byte multiples: the fallback kernel). q4_0 and q8_0
 * rows of these widths take their regrouped G8 layouts on the device (k_matvec_q4g); K = 800 (the 32-block
 * types only) keeps the GGUF layout and its kernels; K = 2048: Q6_K in its G8 layout too. */
TEST(op_matmul) {
    NEED_GPU();
    const int Ks[] = {512, 2304, 800, 2048}, N = 96, ns[] = {1, 5, 33};
    for (size_t ti = 0; ti < 4 * N_TYPES; ti++) {
        const int K = Ks[ti / N_TYPES];
        qf_type t = all_types[ti % N_TYPES];
        if (K % 256 && qf_type_block_elems(t) > 32) continue;
        qf_weight w = {.type = t, .ne0 = K, .ne1 = N, .row_bytes = qf_row_bytes(t, K)};
        void *wd = rand_weight(t, N, K);
        w.data = wd;
        float *wf = malloc((size_t)N * K * 4);
        for (int r = 0; r < N; r++) qf_dequantize_row_ref(t, (uint8_t *)wd + (size_t)r * w.row_bytes, wf + (size_t)r * K, K);
        for (size_t ni = 0; ni < 3; ni++) {
            int n = ns[ni];
            float *x = malloc((size_t)n * K * 4), *ref = malloc((size_t)n * N * 4), *got = malloc((size_t)n * N * 4);
            for (int i = 0; i < n * K; i++) x[i] = frand();
            for (int tt = 0; tt < n; tt++)
                for (int r = 0; r < N; r++) {
                    double s = 0;
                    for (int i = 0; i < K; i++) s += (double)x[(size_t)tt * K + i] * wf[(size_t)r * K + i];
                    ref[(size_t)tt * N + r] = (float)s;
                }
            qf_cuda_mm_route routes[] = {QF_CUDA_MM_MATVEC, QF_CUDA_MM_GEMM_F16, QF_CUDA_MM_GEMM_F32};
            const char *rn[] = {"matvec", "gemm-f16", "gemm-f32"};
            double bound[] = {1e-10, 2e-6, 1e-10};
            for (int ri = 0; ri < 3; ri++) {
                if (routes[ri] == QF_CUDA_MM_MATVEC && n > 8) continue;
                qf_error err = {0};
                CHECK_MSG(qf_cuda_op_matmul(&w, x, n, got, routes[ri], &err) == QF_OK, "%s", err.msg);
                double e = nmse(got, ref, (size_t)n * N);
                if (routes[ri] == QF_CUDA_MM_MATVEC && mv_int8(t)) {
                    /* int8 activations: certified against the CPU's vec_dot; the f32 dot's
                     * distance is the activation rounding, printed */
                    float *vd = malloc((size_t)n * N * 4);
                    vec_dot_oracle(t, wd, K, N, x, n, vd);
                    const double ef = e;
                    e = nmse(got, vd, (size_t)n * N);
                    printf("  matmul %-5s K=%-4d n=%-2d %-8s nmse %.3g against vec_dot (%s activations), %.3g against "
                           "the f32 dot\n", qf_type_name(t), K, n, rn[ri], e, qf_type_name(qf_vec_dot_type(t)), ef);
                    free(vd);
                } else if (ni == 1 || (ni == 0 && ri == 0))
                    printf("  matmul %-5s K=%-4d n=%-2d %-8s nmse %.3g\n", qf_type_name(t), K, n, rn[ri], e);
                CHECK_MSG(e <= bound[ri], "matmul %s K=%d n=%d %s nmse %g", qf_type_name(t), K, n, rn[ri], e);
            }
            free(x), free(ref), free(got);
        }
        free(wd), free(wf);
    }
}

/* many rows (one warp per row in the decode kernels, or the one-token kernels' row groups;
 * fewer rows share 4 warps each): N = 8200, and N = 2053 / 2051 / 1031 whose last row group is
 * partial, at K = 512 (f16 and q4_0: 4 rows per group), K = 8448 (q4_0: 2 rows per group) and
 * K = 6144 (Q6_K's G8 layout, three groups a row) */
TEST(op_matmul_tall) {
    NEED_GPU();
    const int shapes[][2] = {{256, 8200}, {512, 2053}, {8448, 2051}, {6144, 1031}};
    const qf_type types[] = {QF_TYPE_F16, QF_TYPE_BF16, QF_TYPE_Q4_0, QF_TYPE_Q8_0, QF_TYPE_Q4_K, QF_TYPE_Q5_K, QF_TYPE_Q6_K};
    const size_t nt = sizeof types / sizeof types[0];
    for (size_t ti = 0; ti < sizeof shapes / sizeof shapes[0] * nt; ti++) {
        const int K = shapes[ti / nt][0], N = shapes[ti / nt][1];
        const qf_type t = types[ti % nt];
        qf_weight w = {.type = t, .ne0 = K, .ne1 = N, .row_bytes = qf_row_bytes(t, K)};
        void *wd = rand_weight(t, N, K);
        w.data = wd;
        float *wf = malloc((size_t)N * K * 4), *x = malloc(5 * K * 4), *ref = malloc((size_t)5 * N * 4),
              *got = malloc((size_t)5 * N * 4);
        for (int r = 0; r < N; r++) qf_dequantize_row_ref(t, (uint8_t *)wd + (size_t)r * w.row_bytes, wf + (size_t)r * K, K);
        for (int i = 0; i < 5 * K; i++) x[i] = frand();
        for (int n = 1; n <= 5; n += 4) {
            for (int tt = 0; tt < n; tt++)
                for (int r = 0; r < N; r++) {
                    double a = 0;
                    for (int i = 0; i < K; i++) a += (double)x[(size_t)tt * K + i] * wf[(size_t)r * K + i];
                    ref[(size_t)tt * N + r] = (float)a;
                }
            if (mv_int8(t)) vec_dot_oracle(t, wd, K, N, x, n, ref);
            qf_error err = {0};
            CHECK_MSG(qf_cuda_op_matmul(&w, x, n, got, QF_CUDA_MM_MATVEC, &err) == QF_OK, "%s", err.msg);
            double e = nmse(got, ref, (size_t)n * N);
            printf("  matmul %-5s K=%d N=%d n=%d matvec nmse %.3g\n", qf_type_name(t), K, N, n, e);
            CHECK_MSG(e <= 1e-10, "matmul %s K=%d N=%d n=%d nmse %g", qf_type_name(t), K, N, n, e);
        }
        free(wd), free(wf), free(x), free(ref), free(got);
    }
}

/* decode gate|up with SiLU(gate) * up at the end of the matvec (2F >= 8192 rows; odd F); Q6_K
 * also at K = 2048 (its G8 layout) */
TEST(op_matvec_gu) {
    NEED_GPU();
    const int F = 4101;
    const qf_type types[] = {QF_TYPE_F16, QF_TYPE_BF16, QF_TYPE_Q4_0, QF_TYPE_Q8_0, QF_TYPE_Q4_K, QF_TYPE_Q5_K, QF_TYPE_Q6_K, QF_TYPE_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const qf_type t = types[ti];
        const int K = ti + 1 == sizeof types / sizeof types[0] ? 2048 : 256;
        qf_weight w = {.type = t, .ne0 = K, .ne1 = 2 * F, .row_bytes = qf_row_bytes(t, K)};
        void *wd = rand_weight(t, 2 * F, K);
        w.data = wd;
        float *wf = malloc((size_t)2 * F * K * 4), *x = malloc(5 * K * 4), *y = malloc((size_t)5 * 2 * F * 4),
              *ref = malloc((size_t)5 * F * 4), *got = malloc((size_t)5 * F * 4);
        for (int r = 0; r < 2 * F; r++) qf_dequantize_row_ref(t, (uint8_t *)wd + (size_t)r * w.row_bytes, wf + (size_t)r * K, K);
        for (int i = 0; i < 5 * K; i++) x[i] = frand();
        for (int n = 1; n <= 5; n += 4) {
            if (mv_int8(t)) vec_dot_oracle(t, wd, K, 2 * F, x, n, y);
            else
                for (int tt = 0; tt < n; tt++)
                    for (int r = 0; r < 2 * F; r++) {
                        double a = 0;
                        for (int i = 0; i < K; i++) a += (double)x[(size_t)tt * K + i] * wf[(size_t)r * K + i];
                        y[(size_t)tt * 2 * F + r] = (float)a;
                    }
            for (int tt = 0; tt < n; tt++)
                for (int r = 0; r < F; r++) {
                    const float g = y[(size_t)tt * 2 * F + r], u = y[(size_t)tt * 2 * F + F + r];
                    ref[(size_t)tt * F + r] = g / (1.0f + expf(-g)) * u;
                }
            qf_error err = {0};
            CHECK_MSG(qf_cuda_op_matvec_gu(&w, x, n, F, got, &err) == QF_OK, "%s", err.msg);
            double e = nmse(got, ref, (size_t)n * F);
            printf("  matvec gate|up + SiLU %-5s K=%d F=%d n=%d nmse %.3g\n", qf_type_name(t), K, F, n, e);
            CHECK_MSG(e <= 1e-10, "matvec gu %s n=%d nmse %g", qf_type_name(t), n, e);
        }
        free(wd), free(wf), free(x), free(y), free(ref), free(got);
    }
    /* where it does not apply: refused, nothing written */
    qf_weight w = {.type = QF_TYPE_Q5_0, .ne0 = 256, .ne1 = 2 * 4096, .row_bytes = qf_row_bytes(QF_TYPE_Q5_0, 256)};
    void *wd = rand_weight(QF_TYPE_Q5_0, 2 * 4096, 256);
    w.data = wd;
    float x[256] = {0}, *hb = malloc(4096 * 4);
    qf_error err = {0};
    CHECK(qf_cuda_op_matvec_gu(&w, x, 1, 4096, hb, &err) == QF_ERR_DEVICE);
    free(wd), free(hb);
}

/* The decode norm's fused activation (launch_rmsnorm's xq): the q8_0 bytes the int8 matvecs
 * read must be the separate quantization launch's, byte for byte (widths with partial register
 * passes, several rows, a zero row, a row where one element dominates) */
TEST(op_rmsnorm_act) {
    NEED_GPU();
    const int dims[] = {256, 800, 2304, 4096, 5120};
    const int n = 3;
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
        const int d = dims[k];
        const size_t qb = (size_t)n * d + (size_t)n * (d / 32) * 8;
        float *x = malloc((size_t)n * d * 4), *g = malloc((size_t)d * 4), *out = malloc((size_t)n * d * 4);
        uint8_t *q = malloc(qb), *r = malloc(qb);
        for (int i = 0; i < n * d; i++) x[i] = frand() * 3;
        for (int i = 0; i < d; i++) g[i] = frand();
        for (int i = 0; i < d; i++) x[d + i] = 0.0f;                         /* row 1: zeros */
        for (int i = 0; i < d; i++) x[2 * d + i] = (i % 3 == 0) ? 1.0f : -1.0f; /* row 2: ties */
        x[2 * d + 300 % d] = 50.0f;
        qf_error err = {0};
        CHECK(qf_cuda_op_rmsnorm(x, g, n, d, 1e-5f, out, 1, q, r, &err) == QF_OK);
        size_t diff = 0;
        for (size_t i = 0; i < qb; i++) diff += q[i] != r[i];
        printf("  rmsnorm d=%-5d q8_0 activation: %zu of %zu bytes differ from the separate launch\n", d, diff, qb);
        CHECK(diff == 0);
        free(x), free(g), free(out), free(q), free(r);
    }
    /* q8_0 needs whole 32-blocks: the norm says so instead of writing a partial activation */
    float x[100] = {1}, g[100] = {1}, out[100];
    uint8_t q[200], r[200];
    qf_error err = {0};
    CHECK(qf_cuda_op_rmsnorm(x, g, 1, 100, 1e-5f, out, 1, q, r, &err) == QF_ERR_DEVICE);
    CHECK(qf_cuda_op_rmsnorm(x, g, 1, 96, 1e-5f, out, 2, q, r, &err) == QF_ERR_DEVICE);
}

TEST(op_rmsnorm_silu) {
    NEED_GPU();
    const int n = 7, d = 384;
    float x[7 * 384], g[384], ref[7 * 384], got[7 * 384], u[7 * 384];
    for (int i = 0; i < n * d; i++) x[i] = frand() * 3, u[i] = frand() * 2;
    for (int i = 0; i < d; i++) g[i] = frand();
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)(x[t * d + i] * x[t * d + i]);
        float scale = 1.0f / sqrtf((float)(ss / d) + 1e-5f);
        for (int i = 0; i < d; i++) ref[t * d + i] = x[t * d + i] * scale * g[i];
    }
    qf_error err = {0};
    CHECK(qf_cuda_op_rmsnorm(x, g, n, d, 1e-5f, got, 0, NULL, NULL, &err) == QF_OK);
    double e = nmse(got, ref, n * d);
    printf("  rmsnorm nmse %.3g\n", e);
    CHECK(e <= 1e-12);
    for (int i = 0; i < n * d; i++) ref[i] = x[i] / (1.0f + expf(-x[i])) * u[i];
    CHECK(qf_cuda_op_silu_mul(x, u, (size_t)n * d, got, &err) == QF_OK);
    e = nmse(got, ref, n * d);
    printf("  silu*up nmse %.3g\n", e);
    CHECK(e <= 1e-12);
}

TEST(op_rope) {
    NEED_GPU();
    const int n = 5, nh = 3, hd = 64;
    for (int ty = 0; ty < 2; ty++)
        for (int n_rot = hd; n_rot >= hd / 2; n_rot -= hd / 2) {
            qf_rope_type type = ty ? QF_ROPE_NEOX : QF_ROPE_NORM;
            int half = n_rot / 2;
            float v[5 * 3 * 64], ref[5 * 3 * 64], cs[5 * 32], sn[5 * 32];
            for (int i = 0; i < n * nh * hd; i++) ref[i] = v[i] = frand();
            for (int t = 0; t < n; t++) {
                float theta = (float)(100 + t), ts = powf(10000.0f, -2.0f / n_rot);
                for (int i = 0; i < half; i++, theta *= ts) cs[t * half + i] = cosf(theta), sn[t * half + i] = sinf(theta);
            }
            for (int t = 0; t < n; t++)
                for (int h = 0; h < nh; h++) {
                    float *x = ref + (t * nh + h) * hd;
                    for (int i = 0; i < half; i++) {
                        int a = ty ? i : 2 * i, b = ty ? i + half : 2 * i + 1;
                        float x0 = x[a], x1 = x[b];
                        x[a] = x0 * cs[t * half + i] - x1 * sn[t * half + i];
                        x[b] = x0 * sn[t * half + i] + x1 * cs[t * half + i];
                    }
                }
            qf_error err = {0};
            CHECK(qf_cuda_op_rope(v, n, nh, hd, n_rot, type, cs, sn, &err) == QF_OK);
            double e = nmse(v, ref, n * nh * hd);
            printf("  rope %s n_rot %d nmse %.3g\n", ty ? "neox" : "norm", n_rot, e);
            CHECK(e <= 1e-12);
        }
}

static qf_type kv_type_of(qf_kv_mode m) {
    return m == QF_KV_F32 ? QF_TYPE_F32 : m == QF_KV_F16 ? QF_TYPE_F16 : m == QF_KV_Q8_0 ? QF_TYPE_Q8_0 : QF_TYPE_Q4_0;
}

TEST(op_kv_cache) {
    NEED_GPU();
    qf_kv_mode modes[] = {QF_KV_F32, QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0};
    const int rows = 50, hd = 128;
    float *x = malloc(rows * hd * 4), *ref = malloc(rows * hd * 4), *got = malloc(rows * hd * 4);
    uint8_t *cpu = malloc(rows * hd * 4), *gpu = malloc(rows * hd * 4);
    for (int i = 0; i < rows * hd; i++) x[i] = frand() * 3;
    for (int mi = 0; mi < 4; mi++) {
        qf_type t = kv_type_of(modes[mi]);
        size_t rb = qf_row_bytes(t, hd);
        for (int r = 0; r < rows; r++) {
            qf_quantize_row(t, x + r * hd, cpu + r * rb, hd);
            qf_dequantize_row_ref(t, cpu + r * rb, ref + r * hd, hd);
        }
        qf_error err = {0};
        CHECK_MSG(qf_cuda_op_kv_roundtrip(modes[mi], x, rows, hd, gpu, got, &err) == QF_OK, "%s", err.msg);
        size_t diff = 0;
        for (size_t i = 0; i < rb * rows; i++)
            if (cpu[i] != gpu[i] && ++diff <= 4) {
                size_t bb = mi >= 2 ? (mi == 2 ? 34 : 18) : rb, blk = i / bb;
                float amax = 0;
                for (size_t j = blk * 32; j < blk * 32 + 32 && mi >= 2; j++) amax = fmaxf(amax, fabsf(x[j]));
                printf("    byte %zu (block %zu, offset %zu): cpu %02x gpu %02x; block amax %a\n", i, blk, i % bb, cpu[i], gpu[i],
                       (double)amax);
            }
        double e = nmse(got, ref, (size_t)rows * hd);
        printf("  kv cache %-4s: %zu of %zu stored bytes differ from qf_quantize_row, read-back nmse %.3g\n",
               qf_kv_mode_name(modes[mi]), diff, rb * rows, e);
        CHECK(diff == 0);
        CHECK(e <= 1e-14);
    }
    free(x), free(ref), free(got), free(cpu), free(gpu);
}

/* kv-int8 and kv-dict as the GPU cache stores and reads them, against kv_codes.c */
/* --kv-rot hadamard on the GPU cache: the stored blocks are qf_quantize_row(qf_hadamard(row))
 * byte for byte (the device butterfly is bit-identical to hadamard.c) and the read-back is
 * qf_hadamard(dequantize(stored)) */
TEST(op_kv_rot) {
    NEED_GPU();
    qf_kv_mode modes[] = {QF_KV_F32, QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0};
    const int hds[] = {64, 128, 256};
    for (int hi = 0; hi < 3; hi++) {
        const int rows = 40, hd = hds[hi];
        float *x = malloc(rows * hd * 4), *rx = malloc(rows * hd * 4), *ref = malloc(rows * hd * 4),
              *got = malloc(rows * hd * 4);
        uint8_t *cpu = malloc(rows * hd * 4), *gpu = malloc(rows * hd * 4);
        for (int i = 0; i < rows * hd; i++) x[i] = frand() * 3 + (i % hd == 5 ? 20.0f : 0.0f); /* an outlier channel */
        memcpy(rx, x, (size_t)rows * hd * 4);
        qf_hadamard_rows(rx, hd, rows);
        for (int mi = 0; mi < 4; mi++) {
            qf_type t = kv_type_of(modes[mi]);
            size_t rb = qf_row_bytes(t, hd);
            for (int r = 0; r < rows; r++) {
                qf_quantize_row(t, rx + r * hd, cpu + r * rb, hd);
                qf_dequantize_row_ref(t, cpu + r * rb, ref + r * hd, hd);
                qf_hadamard(ref + r * hd, hd);
            }
            qf_error err = {0};
            CHECK_MSG(qf_cuda_op_kv_roundtrip_rot(modes[mi], QF_KV_ROT_HADAMARD, x, rows, hd, gpu, got, &err) == QF_OK,
                      "%s", err.msg);
            size_t diff = 0;
            for (size_t i = 0; i < rb * rows; i++) diff += cpu[i] != gpu[i];
            double e = nmse(got, ref, (size_t)rows * hd), eq = nmse(got, x, (size_t)rows * hd);
            printf("  kv rot hd %-3d %-4s: %zu of %zu stored bytes differ from quantize(hadamard(x)), read-back nmse %.3g "
                   "vs the CPU, %.3g vs x\n",
                   hd, qf_kv_mode_name(modes[mi]), diff, rb * rows, e, eq);
            CHECK(diff == 0);
            CHECK(e <= 1e-14);
        }
        free(x), free(rx), free(ref), free(got), free(cpu), free(gpu);
    }
    /* refused: a head_dim that is not a power of two */
    float x[96] = {0}, out[96];
    uint8_t b[96 * 4];
    qf_error err = {0};
    CHECK(qf_cuda_op_kv_roundtrip_rot(QF_KV_F32, QF_KV_ROT_HADAMARD, x, 1, 96, b, out, &err) == QF_ERR_DEVICE);
}

TEST(op_kv_int8_dict) {
    NEED_GPU();
    const int rows = 40, nkv = 4, hd = 64, dkv = nkv * hd;
    float *x = malloc((size_t)rows * dkv * 4), *sc = malloc(dkv * 4), *inv = malloc(dkv * 4),
          *ref = malloc((size_t)rows * dkv * 4), *got = malloc((size_t)rows * dkv * 4);
    int8_t *qc = malloc((size_t)rows * dkv), *qg = malloc((size_t)rows * dkv);
    for (int i = 0; i < dkv; i++) sc[i] = (0.5f + (frand() + 1)) / 127.0f;
    for (int i = 0; i < rows * dkv; i++) x[i] = frand() * 3; /* some clip at +-127 */
    x[0] = NAN, x[1] = 0.5f * sc[1]; /* NaN -> -127; a tie rounds away from zero */
    qf_kv_int8_inv_scale(sc, inv, dkv);
    for (int r = 0; r < rows; r++) {
        qf_kv_int8_quantize(x + (size_t)r * dkv, inv, qc + (size_t)r * dkv, dkv);
        qf_kv_int8_dequantize(qc + (size_t)r * dkv, sc, ref + (size_t)r * dkv, dkv);
    }
    qf_error err = {0};
    CHECK_MSG(qf_cuda_op_kv_int8_roundtrip(x, rows, dkv, hd, 0, sc, inv, qg, got, &err) == QF_OK, "%s", err.msg);
    size_t diff = 0;
    for (int i = 0; i < rows * dkv; i++) diff += qc[i] != qg[i];
    double e = nmse(got, ref, (size_t)rows * dkv);
    printf("  kv cache int8: %zu of %d stored bytes differ from qf_kv_int8_quantize, read-back nmse %.3g\n", diff, rows * dkv, e);
    CHECK(diff == 0);
    CHECK(e == 0);
    /* the other row layouts (kv-int8 artifacts' static-rot, token-rot, token): each head row
     * rotated (qf_hadamard) for the rot layouts, static per-channel scales or the per-row
     * token code (qf_kv_int8_token_quantize: scale exponent in the code parities), read back
     * and rotated back, as kv_cache.c stores and reads them */
    static const char *const lay_names[] = {"static", "static-rot", "token-rot", "token", "ec-rot"};
    x[0] = 0.5f; /* no NaN here: the rotation would spread it over the row */
    for (int i = 2 * dkv; i < 3 * dkv; i++) x[i] = 0; /* an all-zero row (exponent 0) */
    for (int i = 3 * dkv; i < 4 * dkv; i++) x[i] *= 1e-3f; /* small rows */
    for (int lay = 1; lay < 5; lay++) {
        float row[256];
        if (lay == 4) /* ec-rot: the 4 heads of a token (4 x 64 = 256 elements) coded as one row */
            for (int r = 0; r < rows; r++) {
                const size_t o = (size_t)r * dkv;
                for (int h = 0; h < nkv; h++) {
                    memcpy(row + h * hd, x + o + (size_t)h * hd, hd * 4);
                    qf_hadamard(row + h * hd, hd);
                }
                qf_kv_int8_ec_quantize(row, (uint8_t *)qc + o, dkv);
                qf_kv_int8_ec_dequantize((const uint8_t *)qc + o, dkv, ref + o, dkv);
                for (int h = 0; h < nkv; h++) qf_hadamard(ref + o + (size_t)h * hd, hd);
            }
        for (int r = 0; r < rows && lay < 4; r++)
            for (int h = 0; h < nkv; h++) {
                const size_t o = (size_t)r * dkv + (size_t)h * hd;
                memcpy(row, x + o, hd * 4);
                if (lay != 3) qf_hadamard(row, hd);
                if (lay == 1) qf_kv_int8_quantize(row, inv + h * hd, qc + o, hd);
                else qf_kv_int8_token_quantize(row, qc + o, hd);
                if (lay == 1) qf_kv_int8_dequantize(qc + o, sc + h * hd, ref + o, hd);
                else qf_kv_int8_token_dequantize(qc + o, ref + o, hd);
                if (lay != 3) qf_hadamard(ref + o, hd);
            }
        CHECK_MSG(qf_cuda_op_kv_int8_roundtrip(x, rows, dkv, hd, lay, sc, inv, qg, got, &err) == QF_OK, "%s", err.msg);
        diff = 0;
        for (int i = 0; i < rows * dkv; i++) diff += qc[i] != qg[i];
        e = nmse(got, ref, (size_t)rows * dkv);
        printf("  kv cache int8 %-10s: %zu of %d stored bytes differ from the CPU cache's, read-back nmse %.3g\n",
               lay_names[lay], diff, rows * dkv, e);
        CHECK(diff == 0);
        CHECK(e <= 1e-14);
    }
    /* dict codes: random atoms (unit norm), random codes incl. zero coefficients and a corrupt
     * index; 1- and 2-byte indices, f16 and q8 coefficients */
    int nas[] = {256, 300};
    for (int ai = 0; ai < 2; ai++)
        for (int cf = 0; cf < 2; cf++) {
            int na = nas[ai], sp = 8;
            qf_kv_dict d = {0};
            float *atoms = malloc((size_t)na * hd * 4);
            for (int i = 0; i < na * hd; i++) atoms[i] = frand();
            CHECK(qf_kv_dict_init(&d, atoms, na, hd, &err) == QF_OK);
            size_t rb = qf_kv_code_bytes(na, sp, (qf_kv_coef)cf);
            uint8_t *codes = malloc(rb * rows);
            for (int r = 0; r < rows; r++) {
                uint16_t idx[8];
                float coef[8];
                for (int j = 0; j < sp; j++) {
                    idx[j] = (uint16_t)((frand() * 0.5f + 0.5f) * na);
                    coef[j] = j == 3 ? 0 : frand() * 2;
                }
                if (r == 5) idx[2] = (uint16_t)(na > 256 ? na + 3 : na - 1);
                qf_kv_code_pack(idx, coef, sp, na, (qf_kv_coef)cf, codes + r * rb);
                if (r == 5 && na > 256) codes[r * rb + 2 * 2] = 0xff, codes[r * rb + 2 * 2 + 1] = 0xff; /* corrupt */
                qf_kv_code_decode(&d, codes + r * rb, sp, (qf_kv_coef)cf, ref + (size_t)r * hd);
            }
            CHECK_MSG(qf_cuda_op_kv_dict_decode(codes, rows, hd, rb, d.atoms, na, sp, cf, got, &err) == QF_OK, "%s", err.msg);
            e = nmse(got, ref, (size_t)rows * hd);
            printf("  kv cache dict %d atoms, %s coefficients: decode nmse %.3g\n", na, qf_kv_coef_name((qf_kv_coef)cf), e);
            CHECK(e == 0);
            qf_kv_dict_free(&d);
            free(atoms), free(codes);
        }
    free(x), free(sc), free(inv), free(ref), free(got), free(qc), free(qg);
}

/* the dict cache's encoder on the device against the host's (qf_kv_omp_one + qf_kv_code_pack):
 * random rows, sparse combinations of atoms (exact fits: the residual and pivot stops), a row
 * equal to an atom, a zero row and a NaN row; head_dim 64 and 128, 1- and 2-byte indices, f16
 * and q8 coefficients, sparsity 8 and 16. The stored bytes must be the same */
TEST(op_kv_dict_encode) {
    NEED_GPU();
    const int rows = 96;
    qf_error err = {0};
    for (int hi = 0; hi < 2; hi++)
        for (int ai = 0; ai < 2; ai++)
            for (int cf = 0; cf < 2; cf++)
                for (int si = 0; si < 2; si++) {
                    const int hd = hi ? 128 : 64, na = ai ? 300 : 256, sp = si ? 16 : 8;
                    float *atoms = malloc((size_t)na * hd * 4), *x = malloc((size_t)rows * hd * 4);
                    for (int i = 0; i < na * hd; i++) atoms[i] = frand();
                    qf_kv_dict d = {0};
                    CHECK(qf_kv_dict_init(&d, atoms, na, hd, &err) == QF_OK);
                    for (int r = 0; r < rows; r++) {
                        float *xr = x + (size_t)r * hd;
                        if (r % 3 == 1) { /* a combination of r % 7 + 1 atoms */
                            memset(xr, 0, (size_t)hd * 4);
                            for (int j = 0; j < r % 7 + 1; j++) {
                                const int a = (int)((frand() * 0.5f + 0.5f) * (na - 1));
                                const float c = frand() * 2;
                                for (int t = 0; t < hd; t++) xr[t] += c * d.atoms[(size_t)a * hd + t];
                            }
                        } else
                            for (int t = 0; t < hd; t++) xr[t] = frand() * 3;
                    }
                    memset(x + 4 * (size_t)hd, 0, (size_t)hd * 4);               /* a zero row */
                    x[5 * (size_t)hd + 7] = NAN;                                   /* a NaN row */
                    memcpy(x + 6 * (size_t)hd, d.atoms + 11 * (size_t)hd, (size_t)hd * 4); /* an atom */
                    const size_t rb = qf_kv_code_bytes(na, sp, (qf_kv_coef)cf);
                    uint8_t *ch = malloc(rb * rows), *cg = malloc(rb * rows);
                    float *scratch = malloc(qf_kv_omp_scratch_floats(na, sp) * 4), coef[16];
                    uint16_t idx[16];
                    for (int r = 0; r < rows; r++) {
                        qf_kv_omp_one(&d, x + (size_t)r * hd, sp, scratch, idx, coef);
                        qf_kv_code_pack(idx, coef, sp, na, (qf_kv_coef)cf, ch + (size_t)r * rb);
                    }
                    CHECK_MSG(qf_cuda_op_kv_dict_encode(x, rows, hd, d.atoms, d.gram, na, sp, cf, rb, QF_KV_OMP_STOP_CORR,
                                                        QF_KV_OMP_STOP_PIVOT, cg, &err) == QF_OK,
                              "%s", err.msg);
                    size_t diff = 0, rdiff = 0;
                    for (int r = 0; r < rows; r++) {
                        const size_t dr = (size_t)(memcmp(ch + (size_t)r * rb, cg + (size_t)r * rb, rb) != 0);
                        rdiff += dr;
                        for (size_t b = 0; dr && b < rb; b++) diff += ch[(size_t)r * rb + b] != cg[(size_t)r * rb + b];
                    }
                    printf("  kv dict encode hd %3d, %d atoms, %s, sparsity %2d: %zu of %d rows (%zu bytes) differ from the "
                           "host encoder's\n", hd, na, qf_kv_coef_name((qf_kv_coef)cf), sp, rdiff, rows, diff);
                    CHECK(rdiff == 0);
                    qf_kv_dict_free(&d);
                    free(atoms), free(x), free(ch), free(cg), free(scratch);
                }
    { /* one 8B-shaped batch (512 tokens x 8 kv heads, head_dim 128, 256 atoms, sparsity 16, q8): rows/s */
        const int n = 4096, hd = 128, na = 256, sp = 16;
        float *atoms = malloc((size_t)na * hd * 4), *x = malloc((size_t)n * hd * 4), coef[16];
        for (int i = 0; i < na * hd; i++) atoms[i] = frand();
        for (int i = 0; i < n * hd; i++) x[i] = frand();
        qf_kv_dict d = {0};
        CHECK(qf_kv_dict_init(&d, atoms, na, hd, &err) == QF_OK);
        const size_t rb = qf_kv_code_bytes(na, sp, QF_KV_COEF_Q8);
        uint8_t *ch = malloc(rb * n), *cg = malloc(rb * n);
        float *scratch = malloc(qf_kv_omp_scratch_floats(na, sp) * 4);
        uint16_t idx[16];
        double t0 = qf_now_sec();
        for (int r = 0; r < n; r++) {
            qf_kv_omp_one(&d, x + (size_t)r * hd, sp, scratch, idx, coef);
            qf_kv_code_pack(idx, coef, sp, na, QF_KV_COEF_Q8, ch + (size_t)r * rb);
        }
        const double th = qf_now_sec() - t0;
        for (int it = 0; it < 2; it++) { /* a warm-up, then timed */
            t0 = qf_now_sec();
            CHECK(qf_cuda_op_kv_dict_encode(x, n, hd, d.atoms, d.gram, na, sp, 1, rb, QF_KV_OMP_STOP_CORR,
                                            QF_KV_OMP_STOP_PIVOT, cg, &err) == QF_OK);
        }
        const double tg = qf_now_sec() - t0;
        printf("  kv dict encode, %d rows of 128 (256 atoms, sparsity 16, q8): host encoder (one thread) %.0f rows/s, "
               "device %.0f rows/s (with the op's copies); %s\n", n, n / th, n / tg,
               memcmp(ch, cg, rb * n) ? "bytes DIFFER" : "the same bytes");
        CHECK(memcmp(ch, cg, rb * n) == 0);
        qf_kv_dict_free(&d);
        free(atoms), free(x), free(ch), free(cg), free(scratch);
    }
}

TEST(op_attention) {
    NEED_GPU();
    struct { int n, pos0, nh, nkv, hd; } cases[] = {{7, 20, 8, 2, 64}, {1, 300, 4, 4, 128}, {33, 0, 8, 4, 8}, {16, 5, 6, 2, 256},
                 {130, 70, 8, 2, 128}, {100, 0, 14, 2, 64}, {40, 3, 4, 1, 96},
                 /* long caches for the split-K decode route (GQA-grouped kernel): 64 ranges of 79
                  * keys; 64 of 141 */
                 {1, 5000, 32, 8, 128}, {4, 9000, 8, 2, 64},
                 /* groups of more than 8 heads: the per-head split kernel (ranges of >= 16 keys) */
                 {1, 700, 16, 1, 64}, {3, 40, 12, 1, 128},
                 /* the vectorized f16 split kernel's groups of 8 and 2 */
                 {2, 100, 16, 2, 128}, {1, 33, 4, 2, 64},
                 /* one token over at most 256 (head_dim 128) or 512 (64) keys: k_attn_one (the 8B
                  * shape's heads, and a group of 3; f16, q8_0 and q4_0 rows) */
                 {1, 200, 32, 8, 128}, {1, 480, 6, 2, 64}};
    qf_kv_mode modes[] = {QF_KV_F32, QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int mi = 0; mi < 4; mi++) {
            int n = cases[ci].n, pos0 = cases[ci].pos0, nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd;
            qf_kv_mode mode = modes[mi];
            if (hd % 32 && mode >= QF_KV_Q8_0) continue;
            int T = pos0 + n, Dq = nh * hd;
            size_t kvn = (size_t)T * nkv * hd;
            float *q = malloc((size_t)n * Dq * 4), *k = malloc(kvn * 4), *v = malloc(kvn * 4), *kq = malloc(kvn * 4),
                  *vq = malloc(kvn * 4), *ref = malloc((size_t)n * Dq * 4), *got = malloc((size_t)n * Dq * 4),
                  *S = malloc((size_t)T * 4);
            uint8_t *blk = malloc(qf_row_bytes(QF_TYPE_F32, hd));
            for (int i = 0; i < n * Dq; i++) q[i] = frand() * 2;
            for (size_t i = 0; i < kvn; i++) k[i] = frand() * 2, v[i] = frand();
            /* the CPU sees the cache through the same storage type */
            for (size_t r = 0; r < kvn / hd; r++) {
                qf_quantize_row(kv_type_of(mode), k + r * hd, blk, hd);
                qf_dequantize_row_ref(kv_type_of(mode), blk, kq + r * hd, hd);
                qf_quantize_row(kv_type_of(mode), v + r * hd, blk, hd);
                qf_dequantize_row_ref(kv_type_of(mode), blk, vq + r * hd, hd);
            }
            float scale = 1.0f / sqrtf((float)hd);
            for (int i = 0; i < n; i++)
                for (int h = 0; h < nh; h++) {
                    int kvh = h / (nh / nkv), last = pos0 + i;
                    float mx = -INFINITY;
                    for (int t = 0; t <= last; t++) {
                        double s = 0;
                        for (int d = 0; d < hd; d++) s += (double)q[(size_t)i * Dq + h * hd + d] * kq[((size_t)t * nkv + kvh) * hd + d];
                        S[t] = (float)s * scale;
                        mx = S[t] > mx ? S[t] : mx;
                    }
                    double sum = 0;
                    for (int t = 0; t <= last; t++) sum += (S[t] = expf(S[t] - mx));
                    for (int d = 0; d < hd; d++) {
                        double o = 0;
                        for (int t = 0; t <= last; t++) o += (double)S[t] * vq[((size_t)t * nkv + kvh) * hd + d];
                        ref[(size_t)i * Dq + h * hd + d] = (float)(o / sum);
                    }
                }
            qf_error err = {0};
            CHECK_MSG(qf_cuda_op_attention(q, k, v, n, pos0, nh, nkv, hd, mode, got, &err) == QF_OK, "%s", err.msg);
            double e = nmse(got, ref, (size_t)n * Dq);
            printf("  attention n=%d pos0=%d heads %d/%d hd %d kv %-4s nmse %.3g\n", n, pos0, nh, nkv, hd, qf_kv_mode_name(mode), e);
            CHECK_MSG(e <= 1e-10, "attention kv %s nmse %g", qf_kv_mode_name(mode), e);
            if (n <= 8) { /* the decode route: split-K over the cache */
                CHECK_MSG(qf_cuda_op_attention_split(q, k, v, n, pos0, nh, nkv, hd, mode, got, &err) == QF_OK, "%s", err.msg);
                e = nmse(got, ref, (size_t)n * Dq);
                printf("  attention split-K (decode)                nmse %.3g\n", e);
                CHECK_MSG(e <= 1e-10, "split-K attention kv %s nmse %g", qf_kv_mode_name(mode), e);
                /* k_attn_one's limit (cuda_common.cuh attention_one_keys), for the labels */
                const int one = hd == 64 ? 512 : hd == 128 ? 256 : 0;
                if (n == 1 && hd % 32 == 0 && mode != QF_KV_F32) {
                    /* the decode step's form: the q|k|v split (and a quantized cache's K|V write)
                     * and the o activation folded in (past k_attn_one a q8_0 / q4_0 cache's split
                     * stores the rows itself), the same bytes as the separate launches (the op
                     * compares them) */
                    CHECK_MSG(qf_cuda_op_attention_fused(q, k, v, pos0, nh, nkv, hd, mode, QF_KV_ROT_NONE, got, &err) ==
                                  QF_OK,
                              "%s", err.msg);
                    printf("  attention %s, split%s and o quantization folded in: the same bytes\n",
                           T <= one ? "k_attn_one" : "split-K", mode == QF_KV_F16 ? "" : T <= one ? ", K|V write" : " storing the rows");
                }
                if (n == 1 && mode != QF_KV_F32 && hd % 32 == 0 && (hd & (hd - 1)) == 0) {
                    /* --kv-rot hadamard folded into k_attn_one too (q, K and V rotated before the
                     * K|V write, the output rotated back), past its keys the output's rotation
                     * into split-K's merge: the same bytes as the separate rotation launches */
                    CHECK_MSG(qf_cuda_op_attention_fused(q, k, v, pos0, nh, nkv, hd, mode, QF_KV_ROT_HADAMARD, got, &err) ==
                                  QF_OK,
                              "%s", err.msg);
                    printf("  attention %s with --kv-rot, %s and o quantization folded in: the same bytes\n",
                           T <= one ? "k_attn_one" : "split-K",
                           T <= one ? "split, rotations, K|V write" : "the split's rotations and K|V write, the output's rotation");
                }
            }
            if (hd <= 256) {
                /* the tensor-core route prefill takes: Q and P in f16, the f32 / q8_0 / q4_0 rows
                 * dequantized to f16 by the kernel (f32: the int8 / dict expansions' route) */
                CHECK_MSG(qf_cuda_op_attention_route(q, k, v, n, pos0, nh, nkv, hd, mode, true, got, &err) == QF_OK, "%s",
                          err.msg);
                e = nmse(got, ref, (size_t)n * Dq);
                printf("  attention flash (tensor cores)            nmse %.3g\n", e);
                CHECK_MSG(e <= 2e-6, "flash attention nmse %g", e);
            }
            free(q), free(k), free(v), free(kq), free(vq), free(ref), free(got), free(S), free(blk);
        }
}

/* ---- end to end on the real models ---- */

typedef struct {
    int n_layer, dkv, n_ctx;
    float *k, *v; /* [layer][pos][dkv] */
    double act_sum[4];
} capture;

static void cap_kv(void *user, int layer, int pos0, int n_tok, int n_head_kv, int head_dim, const float *k, const float *v) {
    capture *c = user;
    size_t off = ((size_t)layer * c->n_ctx + pos0) * c->dkv, cnt = (size_t)n_tok * n_head_kv * head_dim;
    memcpy(c->k + off, k, cnt * 4);
    memcpy(c->v + off, v, cnt * 4);
}
static void cap_act(void *user, int layer, qf_act_site site, int n_tok, int dim, const float *x) {
    capture *c = user;
    (void)layer;
    for (size_t i = 0; i < (size_t)n_tok * dim; i++) c->act_sum[site] += fabs(x[i]);
}

/* prefill n0 tokens then decode n1 more one at a time; logits of every token */
static bool run_seq(qf_model *m, qf_device dev, bool reference, qf_kv_mode kv, const int32_t *toks, int n0, int n1,
                    float *logits, capture *cap) {
    qf_context_params p = qf_context_default_params();
    p.n_ctx = cap->n_ctx;
    p.kv_k = p.kv_v = kv;
    p.device = dev;
    p.reference = reference;
    qf_error err = {0};
    qf_context *c = qf_context_new(m, &p, &err);
    CHECK_MSG(c, "%s", err.msg);
    if (!c) return false;
    CHECK_EQ_INT(qf_context_device(c), dev);
    qf_tap tap = {.user = cap, .on_kv = cap_kv, .on_act = cap_act};
    qf_context_set_tap(c, &tap);
    int nv = qf_model_hparams(m)->n_vocab;
    bool ok = qf_decode(c, toks, n0, 0, logits, 0, &err) == QF_OK;
    for (int i = 0; ok && i < n1; i++)
        ok = qf_decode(c, toks + n0 + i, 1, n0 + i, logits + (size_t)(n0 + i) * nv, 0, &err) == QF_OK;
    CHECK_MSG(ok, "%s", err.msg);
    qf_context_free(c);
    return ok;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Does got pick the reference's top-1, or a token the reference puts within 4 rms of the
 * row's difference (got - ref) of its top-1 (a near-tie that the rounding of a quantized cache
 * may flip either way)? */
static bool top1_near(const float *got, const float *ref, int n) {
    const int a = argmax(ref, n), b = argmax(got, n);
    if (a == b) return true;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)(got[i] - ref[i]) * (got[i] - ref[i]);
    return ref[a] - ref[b] <= 4 * sqrt(ss / n);
}

static void e2e_model(const char *name) {
    const char *path = model_path(name);
    if (!path) {
        printf("  %s: not found, skipped\n", name);
        return;
    }
    qf_error err = {0};
    qf_model *m = qf_model_load(path, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!m) return;
    const qf_hparams *hp = qf_model_hparams(m);
    const int n0 = 40, n1 = 4, n = n0 + n1, nv = hp->n_vocab;
    int32_t toks[44];
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * (nv - 1));
    capture cc = {hp->n_layer, hp->n_head_kv * hp->head_dim, 64, 0, 0, {0}}, gc = cc, fc = cc;
    size_t kvn = (size_t)hp->n_layer * 64 * cc.dkv;
    cc.k = calloc(kvn, 4), cc.v = calloc(kvn, 4), gc.k = calloc(kvn, 4), gc.v = calloc(kvn, 4);
    fc.k = calloc(kvn, 4), fc.v = calloc(kvn, 4);
    float *lc = malloc((size_t)n * nv * 4), *lg = malloc((size_t)n * nv * 4), *lf = malloc((size_t)n * nv * 4);
    qf_kv_mode modes[] = {QF_KV_F32, QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0};
    for (int mi = 0; mi < 4; mi++) {
        if (modes[mi] >= QF_KV_Q8_0 && hp->head_dim % 32) continue;
        bool ok = run_seq(m, QF_DEVICE_CPU, true, modes[mi], toks, n0, n1, lc, &cc) &&
                  run_seq(m, QF_DEVICE_CUDA, false, modes[mi], toks, n0, n1, lg, &gc) &&
                  run_seq(m, QF_DEVICE_CPU, false, modes[mi], toks, n0, n1, lf, &fc);
        if (!ok) break;
        double e = nmse(lg, lc, (size_t)n * nv), ek = nmse(gc.k, cc.k, kvn), ev = nmse(gc.v, cc.v, kvn);
        /* the CPU's own production route (int8 activations in the quantized matvecs, as the
         * GPU's decode kernels) against the same reference */
        const double fe = nmse(lf, lc, (size_t)n * nv), fk = nmse(fc.k, cc.k, kvn), fv = nmse(fc.v, cc.v, kvn);
        int agree = 0, near = 0;
        for (int t = 0; t < n; t++) {
            agree += argmax(lg + (size_t)t * nv, nv) == argmax(lc + (size_t)t * nv, nv);
            near += top1_near(lg + (size_t)t * nv, lc + (size_t)t * nv, nv);
        }
        double ea = fabs(gc.act_sum[3] - cc.act_sum[3]) / cc.act_sum[3];
        printf("  %-34s kv %-4s logits nmse %.3g (prefill+decode), top-1 %d/%d (%d/%d with near-ties), tap K nmse %.3g V "
               "nmse %.3g, ffn_down act %.2g; the CPU's fast route: logits %.3g, K %.3g, V %.3g\n",
               name + 7, qf_kv_mode_name(modes[mi]), e, agree, n, near, n, ek, ev, ea, fe, fk, fv);
        /* the bounds: fixed, or twice the CPU fast route's own distance from the reference where
         * that is larger (quantized models: the int8 activations of the decode matvecs move the
         * logits by 4e-5..2e-4 on the CPU too) */
        const double lb = fmax(modes[mi] == QF_KV_Q4_0 ? 1e-3 : 1e-4, 2 * fe);
        CHECK_MSG(e <= lb, "%s kv %s: logits nmse %g (bound %g)", name, qf_kv_mode_name(modes[mi]), e, lb);
        /* q4_0 rounds K/V to 16 levels: a last-bit difference upstream (the decode matvec's
         * summation order) moves whole steps, which the next layers' taps see (1.04e-4 measured
         * for the q4_k_m model; 3e-5..6e-5 on the others) */
        const double tb = modes[mi] == QF_KV_Q4_0 ? 3e-4 : 1e-4;
        CHECK_MSG(ek <= fmax(tb, 2 * fk) && ev <= fmax(tb, 2 * fv), "%s: tap K/V nmse %g %g (CPU fast route %g %g)", name,
                  ek, ev, fk, fv);
        /* top-1 on random tokens: q4_0 K/V moves near-ties by whole steps (41/44 seen on the
         * q4_k_m model, whose q8_0 tensors' decode matvecs round the activation to q8_0 as the
         * CPU's vec_dot does, where the reference route keeps f32; 39/44 on the f16 model with
         * the tokens drawn since op_attention's k_attn_one cases, the same with the split-K
         * kernels): a miss counts unless it is a near-tie (top1_near), as in e2e_decode_graph */
        CHECK_MSG(near >= n - (modes[mi] == QF_KV_Q4_0 ? 4 : 2), "%s kv %s: top-1 %d/%d, %d/%d with near-ties", name,
                  qf_kv_mode_name(modes[mi]), agree, n, near, n);
        CHECK(ea < 1e-2);
        memset(cc.act_sum, 0, sizeof cc.act_sum), memset(gc.act_sum, 0, sizeof gc.act_sum);
        memset(fc.act_sum, 0, sizeof fc.act_sum);
    }
    free(cc.k), free(cc.v), free(gc.k), free(gc.v), free(fc.k), free(fc.v), free(lc), free(lg), free(lf);
    qf_model_free(m);
}

TEST(e2e_logits_and_taps) {
    NEED_GPU();
    e2e_model("models/qforge-demo-11m-f16.gguf");
    e2e_model("models/qforge-demo-11m-q8_0.gguf");
    e2e_model("models/qforge-demo-11m-q4_k_m.gguf");
    e2e_model("models/qforge-demo-qwen2-5m-f16.gguf");
    e2e_model("models/qforge-demo-qwen2-5m-q4_k_m.gguf");
}

/* ---- the model families (docs/families.md) against Hugging Face transformers ----
 * tests/fixtures/families/<fam>.gguf: tiny random-weight models (f32) written from
 * transformers; <fam>.logits: transformers' float32 logits of 128 fixed tokens
 * (tests/test_families.c checks the CPU against them). Here the GPU: one prefill, decode steps
 * of 1 token and batches of 5 (the matvec routes), f32 KV cache, against transformers (the
 * issue's bar: nMSE <= 1e-5, top-1 >= 99%) and against the CPU's fast route (the same bar);
 * and the default f16 cache against the CPU's f16 cache. QF_FAMILIES_DIR overrides the folder
 * (run from the repository root otherwise). */
/* logits of every token of r on dev, in batches of `step` tokens (NULL on failure) */
static float *fam_run(qf_model *m, const test_logits *r, qf_device dev, int step, qf_kv_mode kv) {
    qf_error e = {0};
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 2;
    cp.device = dev;
    cp.kv_k = cp.kv_v = kv;
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK_MSG(c, "context on %s: %s", qf_device_name(dev), e.msg);
    if (!c) return NULL;
    CHECK_EQ_INT(qf_context_device(c), dev);
    float *lg = malloc((size_t)r->n_tok * r->n_vocab * sizeof(float));
    for (int i = 0; lg && i < r->n_tok; i += step) {
        int bs = r->n_tok - i < step ? r->n_tok - i : step;
        if (qf_decode(c, r->tokens + i, bs, i, lg + (size_t)i * r->n_vocab, 0, &e)) {
            CHECK_MSG(0, "decode on %s: %s", qf_device_name(dev), e.msg);
            free(lg);
            lg = NULL;
        }
    }
    qf_context_free(c);
    return lg;
}

/* nMSE of a against b over n_tok x V, and the fraction of rows whose argmax agrees */
static void fam_compare(const float *a, const float *b, int n_tok, int V, double *e, double *top1) {
    int agree = 0;
    for (int t = 0; t < n_tok; t++) agree += argmax(a + (size_t)t * V, V) == argmax(b + (size_t)t * V, V);
    *e = nmse(a, b, (size_t)n_tok * V);
    *top1 = (double)agree / n_tok;
}

TEST(e2e_families) {
    NEED_GPU();
    const char *dir = getenv("QF_FAMILIES_DIR") ? getenv("QF_FAMILIES_DIR") : "tests/fixtures/families";
    static const char *const fams[] = {"qwen3", "qwen3moe", "qwen2moe", "mixtral", "gemma2", "gemma3", "phi3"};
    char path[512];
    snprintf(path, sizeof path, "%s/qwen3.gguf", dir);
    if (access(path, R_OK) != 0) SKIP("tests/fixtures/families not found (run from the repository root or set QF_FAMILIES_DIR)");
    for (size_t fi = 0; fi < sizeof fams / sizeof fams[0]; fi++) {
        test_logits r;
        snprintf(path, sizeof path, "%s/%s.logits", dir, fams[fi]);
        if (access(path, R_OK) != 0) {
            printf("  %-8s %s not found, skipped\n", fams[fi], path);
            continue;
        }
        bool rok = test_read_logits(path, &r);
        CHECK_MSG(rok, "%s: reference logits did not load", path);
        snprintf(path, sizeof path, "%s/%s.gguf", dir, fams[fi]);
        qf_error err = {0};
        qf_model *m = rok ? qf_model_load(path, &err) : NULL;
        CHECK_MSG(m, "%s: %s", path, err.msg);
        if (!m) {
            test_free_logits(&r);
            continue;
        }
        const int T = r.n_tok, V = r.n_vocab;
        CHECK_EQ_INT(V, qf_model_hparams(m)->n_vocab);
        float *cpu = fam_run(m, &r, QF_DEVICE_CPU, T, QF_KV_F32);
        float *cpu16 = fam_run(m, &r, QF_DEVICE_CPU, T, QF_KV_F16);
        static const int steps[] = {128, 1, 5};
        for (int si = 0; si < 3; si++) {
            float *gpu = fam_run(m, &r, QF_DEVICE_CUDA, steps[si], QF_KV_F32);
            if (!gpu || !cpu) {
                free(gpu);
                continue;
            }
            double e_hf, t_hf, e_cpu, t_cpu;
            fam_compare(gpu, r.logits, T, V, &e_hf, &t_hf);
            fam_compare(gpu, cpu, T, V, &e_cpu, &t_cpu);
            printf("  %-8s GPU %-8s kv f32: vs transformers nmse %.2e top-1 %.1f%%; vs CPU nmse %.2e top-1 %.1f%%\n",
                   fams[fi], steps[si] >= T ? "prefill" : steps[si] == 1 ? "decode" : "batch-5", e_hf, 100 * t_hf,
                   e_cpu, 100 * t_cpu);
            CHECK_MSG(e_hf <= 1e-5 && t_hf >= 0.99, "%s step %d: GPU vs transformers nmse %g top-1 %g", fams[fi],
                      steps[si], e_hf, t_hf);
            CHECK_MSG(e_cpu <= 1e-5 && t_cpu >= 0.99, "%s step %d: GPU vs CPU nmse %g top-1 %g", fams[fi], steps[si],
                      e_cpu, t_cpu);
            free(gpu);
        }
        float *gpu16 = fam_run(m, &r, QF_DEVICE_CUDA, T, QF_KV_F16);
        if (gpu16 && cpu16) {
            double e_hf, t_hf, e_cpu, t_cpu;
            fam_compare(gpu16, r.logits, T, V, &e_hf, &t_hf);
            fam_compare(gpu16, cpu16, T, V, &e_cpu, &t_cpu);
            printf("  %-8s GPU prefill  kv f16: vs transformers nmse %.2e top-1 %.1f%%; vs CPU f16 nmse %.2e top-1 %.1f%%\n",
                   fams[fi], e_hf, 100 * t_hf, e_cpu, 100 * t_cpu);
            /* the f16 cache rounds K and V: the CPU's own f16 run is 1.2e-4 from transformers on
             * mixtral (an expert choice flipped), docs/families.md */
            CHECK_MSG(e_cpu <= 1e-3 && t_cpu >= 0.97, "%s kv f16: GPU vs CPU nmse %g top-1 %g", fams[fi], e_cpu, t_cpu);
        }
        free(gpu16), free(cpu), free(cpu16);
        test_free_logits(&r);
        qf_model_free(m);
    }
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s) {
        fclose(f);
        return NULL;
    }
    *len = fread(s, 1, (size_t)n, f);
    fclose(f);
    return s;
}

static qf_kv_rot ppl_rot;  /* the rotation ppl_of_art's contexts run with */
static bool ppl_gemm_f32;  /* and the f32 GEMM route (qf_cuda_params.gemm_f32) */
static bool ppl_attn_warp; /* and the f32 warp attention kernel in prefill (qf_cuda_params.attn_warp) */

static double ppl_of_art(qf_model *m, qf_device dev, qf_kv_mode kv, const qf_artifact *art, const char *text, size_t len,
                         double *tps) {
    qf_context_params p = qf_context_default_params();
    p.n_ctx = 512;
    p.kv_k = p.kv_v = kv;
    p.kv_rot = ppl_rot;
    p.cuda.gemm_f32 = ppl_gemm_f32;
    p.cuda.attn_warp = ppl_attn_warp;
    p.device = dev;
    qf_error err = {0};
    qf_context *c = qf_context_new(m, &p, &err);
    CHECK_MSG(c, "%s", err.msg);
    if (!c) return NAN;
    if (art && qf_context_bind_artifact(c, art, &err)) {
        CHECK_MSG(0, "binding on %s: %s", qf_device_name(dev), err.msg);
        qf_context_free(c);
        return NAN;
    }
    qf_ppl_params pp = qf_ppl_default_params();
    pp.n_ctx = 512;
    pp.n_chunks = 6;
    qf_ppl_result r;
    qf_status st = qf_perplexity_text(c, text, len, &pp, &r, &err);
    CHECK_MSG(st == QF_OK, "%s", err.msg);
    qf_context_free(c);
    *tps = r.tokens_per_sec;
    return st == QF_OK ? r.ppl : NAN;
}
static double ppl_of(qf_model *m, qf_device dev, qf_kv_mode kv, const char *text, size_t len, double *tps) {
    return ppl_of_art(m, dev, kv, NULL, text, len, tps);
}

/* CPU vs GPU PPL slack for a model: on CPUs with AVX-512 VNNI the CPU rounds the activations of
 * quantized-weight matmuls to 8 bits (Q8_0 / Q8_K, as llama.cpp does; kernels/gemm.h), which the
 * GPU's GEMMs do not. Measured on the H200 machine (2026-12-01): up to 1.6e-3 with f32/f16/q8_0 KV,
 * and 6.2e-3 for qwen2-5m q4_k_m with a q4_0 KV cache, where the 4-bit K rounding amplifies the
 * difference. f16-weight models keep the tight bound: they test the GPU kernels themselves. */
static double cpu_gpu_slack(const char *model, qf_kv_mode kv) {
    if (strstr(model, "-f16")) return 0;
    return kv == QF_KV_Q4_0 ? 1e-2 : 3e-3;
}

TEST(e2e_perplexity) {
    NEED_GPU();
    const char *cp = test_data("corpora/kerneldoc-demo/docs.txt");
    if (!cp) SKIP("corpora/kerneldoc-demo/docs.txt not found");
    size_t len = 0;
    char *text = read_text(cp, &len);
    if (!text) SKIP("cannot read the corpus");
    const char *models[] = {"models/qforge-demo-11m-f16.gguf", "models/qforge-demo-11m-q4_k_m.gguf",
                            "models/qforge-demo-qwen2-5m-q4_k_m.gguf"};
    for (size_t i = 0; i < 3; i++) {
        const char *path = model_path(models[i]);
        if (!path) continue;
        qf_error err = {0};
        qf_model *m = qf_model_load(path, &err);
        if (!m) continue;
        qf_kv_mode kvs[] = {QF_KV_F32, QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0};
        for (int k = 0; k < 4; k++) {
            if (kvs[k] >= QF_KV_Q8_0 && qf_model_hparams(m)->head_dim % 32) continue;
            double tc, tg, tw;
            double pc = ppl_of(m, QF_DEVICE_CPU, kvs[k], text, len, &tc);
            double pg = ppl_of(m, QF_DEVICE_CUDA, kvs[k], text, len, &tg);
            double rel = fabs(pg / pc - 1);
            printf("  PPL %-34s kv %-3s: CPU %.4f (%.0f tok/s), GPU %.4f (%.0f tok/s), rel diff %.2e\n", models[i] + 7,
                   qf_kv_mode_name(kvs[k]), pc, tc, pg, tg, rel);
            /* quantized caches on the default route: the flash kernel (f16 Q and P), K/V projected
             * by the f16 q|k|v GEMM on the input and its f16 residual (qforge-demo-11m-f16, kv
             * q4_0: 9.1e-5 on the H200; 1.5e-3 when the q|k|v input was rounded to f16 once) */
            CHECK_MSG(rel < 1e-3 + cpu_gpu_slack(models[i], kvs[k]), "PPL %s kv %s: CPU %f vs GPU %f", models[i], qf_kv_mode_name(kvs[k]), pc, pg);
            if (kvs[k] == QF_KV_Q8_0 || kvs[k] == QF_KV_Q4_0) { /* the prefill's other kernel: f32 warp attention */
                ppl_attn_warp = true;
                double pw = ppl_of(m, QF_DEVICE_CUDA, kvs[k], text, len, &tw);
                ppl_attn_warp = false;
                double relw = fabs(pw / pc - 1);
                printf("  PPL %-34s kv %-3s: GPU, warp attention %.4f (%.0f tok/s), rel diff %.2e\n", models[i] + 7,
                       qf_kv_mode_name(kvs[k]), pw, tw, relw);
                CHECK_MSG(relw < 1e-3 + cpu_gpu_slack(models[i], kvs[k]), "PPL %s kv %s, warp: CPU %f vs GPU %f", models[i],
                          qf_kv_mode_name(kvs[k]), pc, pw);
            }
        }
        qf_model_free(m);
    }
    free(text);
}

/* One-token decode steps replay a CUDA graph of the step (captured at the first step, the
 * position read on the device). The logits must be the same bits as the plain launches
 * (knob no_graph) at every position, across the split-K attention's range changes, for plain
 * cache modes and --kv-rot; and within the e2e bound of the CPU reference. */
/* graph_steps and graph_nodes of the last CUDA context decode_steps_lay ran (qf_cuda_info) */
static long last_graph_steps, last_graph_nodes;
/* decode_steps_lay's context size, and its knob i8_expand (int8 decode through the per-step
 * expansion instead of in place) */
static int dsl_n_ctx = 256;
static bool dsl_i8_expand;
static int dsl_kv_v = -1; /* >= 0: V's cache mode (K and V in different modes), else V's is K's */
static bool dsl_no_norm_fold; /* knob no_norm_fold: each RMSNorm a kernel of its own */

/* n0 prompt tokens then n1 one-token steps; logits [n1][n_vocab] of the steps. klay / vlay
 * (non-NULL): a kv-int8 payload of these row layouts is bound first (per-head scales 0.05: the
 * static layouts' step; the token layouts carry their own) */
static bool decode_steps_lay(qf_model *m, qf_device dev, bool reference, bool no_graph, qf_kv_mode kv, qf_kv_rot rot,
                             const char *klay, const char *vlay, const int32_t *toks, int n0, int n1, float *logits) {
    qf_context_params p = qf_context_default_params();
    p.n_ctx = dsl_n_ctx;
    p.kv_k = kv;
    p.kv_v = dsl_kv_v >= 0 ? (qf_kv_mode)dsl_kv_v : kv;
    p.kv_rot = rot;
    p.device = dev;
    p.reference = reference;
    p.cuda.no_graph = no_graph;
    p.cuda.i8_expand = dsl_i8_expand;
    p.cuda.no_norm_fold = dsl_no_norm_fold;
    qf_error err = {0};
    qf_context *c = qf_context_new(m, &p, &err);
    CHECK_MSG(c, "%s", err.msg);
    if (!c) return false;
    bool ok = !klay || test_bind_int8(c, klay, vlay, &err) == QF_OK;
    const int nv = qf_model_hparams(m)->n_vocab;
    ok = ok && qf_decode(c, toks, n0, 0, NULL, n0, &err) == QF_OK;
    for (int i = 0; ok && i < n1; i++)
        ok = qf_decode(c, toks + n0 + i, 1, n0 + i, logits + (size_t)i * nv, 0, &err) == QF_OK;
    CHECK_MSG(ok, "%s", err.msg);
    qf_cuda_info ci = {0};
    const bool gi = dev == QF_DEVICE_CUDA && qf_context_gpu_info(c, &ci);
    last_graph_steps = gi ? ci.graph_steps : 0;
    last_graph_nodes = gi ? ci.graph_nodes : 0;
    qf_context_free(c);
    return ok;
}
static bool decode_steps(qf_model *m, qf_device dev, bool reference, bool no_graph, qf_kv_mode kv, qf_kv_rot rot,
                         const int32_t *toks, int n0, int n1, float *logits) {
    return decode_steps_lay(m, dev, reference, no_graph, kv, rot, NULL, NULL, toks, n0, n1, logits);
}

/* a decode-graph test's model (NULL, said, when its file is missing or does not load) and its
 * tokens: toks[0, n) drawn from the upper half of the vocabulary */
static qf_model *graph_model(const char *rel, int32_t *toks, int n) {
    const char *path = model_path(rel);
    if (!path) {
        printf("  decode graph: %s not found, skipped\n", rel);
        return NULL;
    }
    qf_error err = {0};
    qf_model *m = qf_model_load(path, &err);
    CHECK_MSG(m, "%s", err.msg);
    const int nv = m ? qf_model_hparams(m)->n_vocab : 0;
    for (int i = 0; m && i < n; i++) toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * (nv - 1));
    return m;
}

/* one decode-graph case: the graph's logits lg against the plain launches' lp (diff: how many
 * differ), lg and the CPU's fast route lf against the CPU reference lc (nmse e, fe), and lg's
 * top-1 against lc's (near: counting near-ties, top1_near); n1 rows of nv */
typedef struct {
    size_t diff;
    double e, fe;
    int agree, near;
} graph_cmp;
/* a decode-graph case's four runs of toks (n0 prompt tokens, then n1 one-token steps): the
 * graph lg, the plain launches lp, the CPU reference lc and the CPU's fast route lf */
static bool graph_runs(qf_model *m, qf_kv_mode kv, qf_kv_rot rot, const int32_t *toks, int n0, int n1, float *lg,
                       float *lp, float *lc, float *lf) {
    return decode_steps(m, QF_DEVICE_CUDA, false, false, kv, rot, toks, n0, n1, lg) &&
           decode_steps(m, QF_DEVICE_CUDA, false, true, kv, rot, toks, n0, n1, lp) &&
           decode_steps(m, QF_DEVICE_CPU, true, true, kv, rot, toks, n0, n1, lc) &&
           decode_steps(m, QF_DEVICE_CPU, false, true, kv, rot, toks, n0, n1, lf);
}
static graph_cmp graph_compare(const float *lg, const float *lp, const float *lc, const float *lf, int n1, int nv) {
    const size_t nl = (size_t)n1 * nv;
    graph_cmp r = {0};
    for (size_t i = 0; i < nl; i++) r.diff += memcmp(lg + i, lp + i, 4) != 0;
    r.e = nmse(lg, lc, nl), r.fe = nmse(lf, lc, nl);
    for (int t = 0; t < n1; t++) {
        r.agree += argmax(lg + (size_t)t * nv, nv) == argmax(lc + (size_t)t * nv, nv);
        r.near += top1_near(lg + (size_t)t * nv, lc + (size_t)t * nv, nv);
    }
    return r;
}

TEST(e2e_decode_graph) {
    NEED_GPU();
    /* the q4_0 copy (qforge quantize; gpu_device_bundle.sh makes it): its ffn_down rows (1024
     * wide) take the G8 layout and k_matvec_q4g, the 384-wide rows the GGUF layout. test-d2048
     * (gen_model_shapes, made there too): 2048 rows and more, so a step runs the one-token
     * row-group kernels (k_mv1_q4g, the down rows' variant too) end to end, its q8_0 copy their
     * q8_0 form, its q6_K copy the one-token kernel of Q6_K's G8 layout (the 2048-wide rows; the
     * 8448-wide down rows keep the GGUF layout) */
    const char *models[] = {"models/qforge-demo-11m-f16.gguf", "models/qforge-demo-11m-q8_0.gguf",
                            "models/qforge-demo-11m-q4_k_m.gguf", "models/qforge-demo-qwen2-5m-q4_k_m.gguf",
                            "models/qforge-demo-11m-q4_0.gguf", "models/test-d2048-q4_0.gguf",
                            "models/test-d2048-q8_0.gguf", "models/test-d2048-q6_k.gguf"};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        /* an 8-token prompt (MATVEC_MAX: the decode route over 8 queries, whose split stores a
         * quantized cache's rows itself), then positions 8..47 a token at a time */
        const int n0 = 8, n1 = 40;
        int32_t toks[49];
        qf_model *m = graph_model(models[mi], toks, n0 + n1);
        if (!m) continue;
        const qf_hparams *hp = qf_model_hparams(m);
        const int nv = hp->n_vocab;
        float *lg = malloc((size_t)n1 * nv * 4), *lp = malloc((size_t)n1 * nv * 4), *lc = malloc((size_t)n1 * nv * 4),
              *lf = malloc((size_t)n1 * nv * 4);
        /* the q4_0 cache and the last f16 one under --kv-rot hadamard (power-of-two head_dim); then
         * K in q8_0 with V in q4_0, K in q4_0 with V in q8_0, and one stream f16 with the other
         * q8_0 or q4_0 (k_attn_split_h with an f16 and a block stream) */
        const qf_kv_mode kvs[] = {QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0, QF_KV_F32, QF_KV_F16,
                                  QF_KV_Q8_0, QF_KV_Q4_0, QF_KV_F16, QF_KV_Q4_0};
        const qf_kv_mode kvv[] = {QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0, QF_KV_F32, QF_KV_F16,
                                  QF_KV_Q4_0, QF_KV_Q8_0, QF_KV_Q8_0, QF_KV_F16};
        _Static_assert(sizeof kvs == sizeof kvv, "a V mode for every K mode");
        const int n_kv = (int)(sizeof kvs / sizeof kvs[0]);
        const bool wide = hp->n_embd >= 2048; /* its slow CPU reference: two cache modes */
        for (int k = 0; k < (wide ? 2 : n_kv); k++) {
            const qf_kv_rot rot =
                (k == 2 || k == 4) && (hp->head_dim & (hp->head_dim - 1)) == 0 ? QF_KV_ROT_HADAMARD : QF_KV_ROT_NONE;
            if (k == 4 && !rot) continue;
            const bool blocks = kvs[k] == QF_KV_Q8_0 || kvs[k] == QF_KV_Q4_0 || kvv[k] == QF_KV_Q8_0 || kvv[k] == QF_KV_Q4_0;
            if (blocks && hp->head_dim % 32) continue;
            dsl_kv_v = kvv[k] != kvs[k] ? (int)kvv[k] : -1;
            const bool ran = graph_runs(m, kvs[k], rot, toks, n0, n1, lg, lp, lc, lf);
            dsl_kv_v = -1;
            if (!ran) break;
            const size_t nl = (size_t)n1 * nv;
            const graph_cmp r = graph_compare(lg, lp, lc, lf, n1, nv); /* fe: the CPU's fast route, as in e2e_model */
            const size_t diff = r.diff;
            const double e = r.e, fe = r.fe;
            const int agree = r.agree, near = r.near;
            printf("  decode graph %-30s kv %-4s%s%s%s: %zu of %zu logits differ from plain launches; nmse %.3g against "
                   "the CPU reference (the CPU's fast route: %.3g), top-1 %d/%d (%d/%d with near-ties)\n",
                   models[mi] + 7, qf_kv_mode_name(kvs[k]), kvv[k] != kvs[k] ? " / v " : "",
                   kvv[k] != kvs[k] ? qf_kv_mode_name(kvv[k]) : "", rot ? " +rot" : "", diff, nl, e, fe, agree, n1, near,
                   n1);
            CHECK_MSG(diff == 0, "%s kv %s: graph replay differs from plain launches", models[mi], qf_kv_mode_name(kvs[k]));
            const bool q4 = kvs[k] == QF_KV_Q4_0 || kvv[k] == QF_KV_Q4_0;
            const double lb = fmax(q4 ? 1e-3 : 1e-4, 2 * fe);
            CHECK_MSG(e <= lb, "%s kv %s: logits nmse %g (bound %g)", models[mi], qf_kv_mode_name(kvs[k]), e, lb);
            /* random tokens on a small model leave near-ties, which a quantized cache's rounding
             * flips either way (the tokens depend on the tests run before: a QF_TEST_ONLY subset
             * drew some where the q8_0 model with a q8_0 cache agreed 37/40 while the CPU's fast
             * route agreed 40/40): a miss counts unless the reference puts the GPU's pick within
             * 4 rms of the row's difference of its own top-1 (top1_near) */
            CHECK_MSG(near >= n1 - (q4 ? 4 : 2), "%s kv %s: top-1 %d/%d, %d/%d with near-ties",
                      models[mi], qf_kv_mode_name(kvs[k]), agree, n1, near, n1);
        }
        free(lg), free(lp), free(lc), free(lf);
        qf_model_free(m);
    }
}

/* Short caches: one token over at most attention_one_keys keys (256 at head_dim 128, 512 at
 * 64) runs k_attn_one (a block per query head, no split, no merge), longer ones split-K. A
 * context twice that replays two graphs, one for each; 24 positions around the limit cross from
 * one to the other. test-d2048 (head_dim 128, GQA group 4) and the demo model (head_dim 64,
 * group 3). The graphs must give the plain launches' bits and stay within e2e_decode_graph's
 * bound of the CPU reference. */
TEST(e2e_decode_graph_one) {
    NEED_GPU();
    const char *models[] = {"models/test-d2048-q4_0.gguf", "models/qforge-demo-11m-f16.gguf"};
    /* f16, q8_0 and q4_0 caches (k_attn_one folds a quantized cache's K|V write too); the
     * 2048-wide model's slow CPU reference: f16 and q8_0. The demo model's last cases: q8_0 under
     * --kv-rot hadamard (folded into k_attn_one, into the split and the merge past it), and K in
     * q8_0 with V in q4_0 */
    const qf_kv_mode kvs[] = {QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0, QF_KV_Q8_0, QF_KV_Q8_0};
    const qf_kv_mode kvv[] = {QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0, QF_KV_Q8_0, QF_KV_Q4_0};
    const qf_kv_rot rots[] = {QF_KV_ROT_NONE, QF_KV_ROT_NONE, QF_KV_ROT_NONE, QF_KV_ROT_HADAMARD, QF_KV_ROT_NONE};
    enum { n1 = 24 };
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        static int32_t toks[512 + n1];
        qf_model *m = graph_model(models[mi], toks, 512 + n1);
        if (!m) continue;
        const int nv = qf_model_hparams(m)->n_vocab, lim = qf_model_hparams(m)->head_dim == 64 ? 512 : 256;
        const int n0 = lim - 12; /* positions lim - 12 .. lim + 11: T = lim is the last short one */
        const size_t nl = (size_t)n1 * nv;
        float *lg = malloc(nl * 4), *lp = malloc(nl * 4), *lc = malloc(nl * 4), *lf = malloc(nl * 4);
        for (int k = 0; k < (qf_model_hparams(m)->n_embd >= 2048 ? 2 : 5); k++) {
            const qf_kv_rot rot = rots[k];
            dsl_n_ctx = 2 * lim;
            dsl_kv_v = kvv[k] != kvs[k] ? (int)kvv[k] : -1;
            const double t0 = qf_now_sec();
            const bool ok = lg && lp && lc && lf && graph_runs(m, kvs[k], rot, toks, n0, n1, lg, lp, lc, lf);
            dsl_n_ctx = 256;
            dsl_kv_v = -1;
            if (!ok) break;
            const graph_cmp r = graph_compare(lg, lp, lc, lf, n1, nv);
            printf("  decode graph %-30s kv %-4s%s%s%s at %d..%d of %d: %zu of %zu logits differ from plain launches; nmse "
                   "%.3g against the CPU reference (the CPU's fast route: %.3g), top-1 %d/%d (%d/%d with near-ties); "
                   "%.1f s\n",
                   models[mi] + 7, qf_kv_mode_name(kvs[k]), kvv[k] != kvs[k] ? " / v " : "",
                   kvv[k] != kvs[k] ? qf_kv_mode_name(kvv[k]) : "", rot ? " +rot" : "", n0,
                   n0 + n1 - 1, 2 * lim, r.diff, nl, r.e, r.fe, r.agree, n1, r.near, n1, qf_now_sec() - t0);
            CHECK_MSG(r.diff == 0, "%s kv %s: graph replay differs from plain launches", models[mi], qf_kv_mode_name(kvs[k]));
            const bool q4 = kvs[k] == QF_KV_Q4_0 || kvv[k] == QF_KV_Q4_0; /* as e2e_decode_graph */
            const double lb = fmax(q4 ? 1e-3 : 1e-4, 2 * r.fe);
            CHECK_MSG(r.e <= lb, "%s kv %s: logits nmse %g (bound %g)", models[mi], qf_kv_mode_name(kvs[k]), r.e, lb);
            CHECK_MSG(r.near >= n1 - (q4 ? 4 : 2), "%s kv %s: top-1 %d/%d, %d/%d with near-ties", models[mi],
                      qf_kv_mode_name(kvs[k]), r.agree, n1, r.near, n1);
        }
        free(lg), free(lp), free(lc), free(lf);
        qf_model_free(m);
    }
}

/* One-token decode folds each RMSNorm into the q4_0 / q8_0 matvecs around it (norm_fold,
 * cuda_common.cuh: o and down write the next norm's q8_0 activation of x g and their rows' sums
 * of squares, q|k|v and gate|up scale their sums by rs). test-d2048 (2048 rows: the one-token
 * kernels; two layers, so down folds the second layer's attention norm and o each FFN norm) in
 * q4_0 and q8_0, f16 and q8_0 caches. The fold must have run (its logits differ from the norm
 * kernels' where only roundings differ) and stay within e2e_decode_graph's bound of the CPU
 * reference, as the norm kernels do (this random model's logits move by ~3.7e-4 nmse between
 * the CPU's own two routes, so the bound is relative to that). Every norm's launch must be gone
 * from the decode graph: two a layer and the output norm (the first layer's attention norm is
 * folded into the embedding). Graph against plain launches with the fold: e2e_decode_graph. */
TEST(e2e_decode_norm_fold) {
    NEED_GPU();
    const char *models[] = {"models/test-d2048-q4_0.gguf", "models/test-d2048-q8_0.gguf"};
    const qf_kv_mode kvs[] = {QF_KV_F16, QF_KV_Q8_0};
    enum { n0 = 8, n1 = 40 };
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        int32_t toks[n0 + n1];
        qf_model *m = graph_model(models[mi], toks, n0 + n1);
        if (!m) continue;
        const int nv = qf_model_hparams(m)->n_vocab;
        const size_t nl = (size_t)n1 * nv;
        float *lf = malloc(nl * 4), *ln = malloc(nl * 4), *lc = malloc(nl * 4), *lx = malloc(nl * 4);
        for (int k = 0; k < 2 && lf && ln && lc && lx; k++) {
            const qf_kv_rot r0 = QF_KV_ROT_NONE;
            bool ok = decode_steps(m, QF_DEVICE_CUDA, false, false, kvs[k], r0, toks, n0, n1, lf);
            const long nodes = last_graph_nodes;
            dsl_no_norm_fold = true;
            ok = ok && decode_steps(m, QF_DEVICE_CUDA, false, false, kvs[k], r0, toks, n0, n1, ln);
            dsl_no_norm_fold = false;
            /* every norm gone: two a layer and the output's (the first layer's into the embedding) */
            const int nly = qf_model_hparams(m)->n_layer;
            CHECK_MSG(!ok || last_graph_nodes - nodes == 2 * nly + 1, "%s: %ld graph nodes with the norm kernels, %ld folded",
                      models[mi], last_graph_nodes, nodes);
            ok = ok && decode_steps(m, QF_DEVICE_CPU, true, true, kvs[k], r0, toks, n0, n1, lc) &&
                 decode_steps(m, QF_DEVICE_CPU, false, true, kvs[k], r0, toks, n0, n1, lx);
            if (!ok) break;
            const graph_cmp r = graph_compare(lf, ln, lc, lx, n1, nv); /* diff: the fold against the norm kernels */
            const double en = nmse(ln, lc, nl), lb = fmax(1e-4, 2 * r.fe);
            printf("  norm fold %-26s kv %-4s: %zu of %zu logits differ from the norm kernels' (nmse %.3g); nmse "
                   "against the CPU reference %.3g (norm kernels %.3g, the CPU's fast route %.3g), top-1 %d/%d "
                   "(%d/%d with near-ties); graph of %ld nodes\n",
                   models[mi] + 7, qf_kv_mode_name(kvs[k]), r.diff, nl, nmse(lf, ln, nl), r.e, en, r.fe, r.agree, n1,
                   r.near, n1, nodes);
            CHECK_MSG(r.diff > 0, "%s: the fold did not run (the norm kernels' bits)", models[mi]);
            CHECK_MSG(r.e <= lb, "%s kv %s: logits nmse %g (bound %g)", models[mi], qf_kv_mode_name(kvs[k]), r.e, lb);
            CHECK_MSG(r.near >= n1 - 2, "%s kv %s: top-1 %d/%d, %d/%d with near-ties", models[mi],
                      qf_kv_mode_name(kvs[k]), r.agree, n1, r.near, n1);
        }
        free(lf), free(ln), free(lc), free(lx);
        qf_model_free(m);
    }
}

/* ---- the sampler's reduction on the device (decode_topk, op_topk) ---- */

/* the host's reduction of a row: max / first argmax / non-finite count over l, the sum of
 * expf((l - max) / temp) in token order, and the k largest as (logit desc, id asc) in ids/vals */
typedef struct {
    float lmax;
    int argmax, nonfinite, n;
    double sum;
} topk_ref;
static const float *topk_row; /* by_row_desc's row */
static int by_row_desc(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    const float u = topk_row[x], v = topk_row[y];
    if (u != v) return u < v ? 1 : -1;
    return x - y;
}
static topk_ref host_topk(const float *l, int V, float temp, int k, int *ids) {
    topk_ref r = {-INFINITY, 0, 0, 0, 0.0};
    int nfin = 0;
    for (int i = 0; i < V; i++) {
        if (!isfinite(l[i])) {
            r.nonfinite++;
            continue;
        }
        if (l[i] > r.lmax || nfin == 0) r.lmax = l[i], r.argmax = i;
        ids[nfin++] = i;
    }
    if (temp > 0)
        for (int i = 0; i < V; i++)
            if (isfinite(l[i])) r.sum += expf((l[i] - r.lmax) / temp);
    topk_row = l;
    qsort(ids, (size_t)nfin, sizeof *ids, by_row_desc);
    r.n = temp > 0 ? (k < nfin ? k : nfin) : 0;
    return r;
}
/* the device's reduction against the host's: "" when they agree, else what differs */
static const char *topk_check(const float *l, int V, float temp, int k, const qf_gpu_topk *d, int *ids) {
    const topk_ref r = host_topk(l, V, temp, k, ids);
    if (d->n_nonfinite != r.nonfinite) return "non-finite count";
    if (r.nonfinite < V && (d->argmax != r.argmax || memcmp(&d->lmax, &r.lmax, 4))) return "max / argmax";
    if (d->n != r.n) return "entry count";
    if (temp > 0 && !(fabs(d->sum - r.sum) <= 1e-6 * r.sum)) return "sum";
    int *dev = malloc(((size_t)d->n + 1) * sizeof *dev);
    for (int i = 0; i < d->n; i++) dev[i] = d->id[i];
    topk_row = l;
    qsort(dev, (size_t)d->n, sizeof *dev, by_row_desc);
    const char *why = "";
    for (int i = 0; i < d->n && !*why; i++)
        if (dev[i] != ids[i]) why = "top-k ids";
    for (int i = 0; i < d->n && !*why; i++)
        if (memcmp(&d->logit[i], &l[d->id[i]], 4)) why = "top-k values";
    free(dev);
    return why;
}

/* row kind: 0 spread, 1 eight levels (ties across the k-th), 2 all equal, 3 negative with a NaN,
 * an Inf and signed zeros, 4 one far above the rest */
static void topk_fill(float *l, int V, int kind, uint64_t *st) {
    for (int i = 0; i < V; i++) {
        const double u = (double)(qf_xorshift64s(st) >> 11) / 9007199254740992.0;
        l[i] = kind == 0   ? (float)(30.0 * u - 10.0)
               : kind == 1 ? (float)(int)(u * 8.0)
               : kind == 2 ? 1.5f
               : kind == 3 ? (u < 0.01 ? (u < 0.005 ? 0.0f : -0.0f) : (float)(-5.0 * u))
                           : (float)(u * 1e-3);
    }
    if (kind == 3 && V > 3) l[V / 2] = NAN, l[V / 3] = INFINITY;
    if (kind == 4) l[V - 1] = 20.0f;
}
/* one row through op_topk against the host: 1 when they differ (printed) */
static int topk_case(const float *l, int V, int kind, float temp, int k, int *ids, int *cases) {
    qf_gpu_topk d;
    memset(&d, 0, sizeof d);
    qf_error err = {0};
    (*cases)++;
    if (qf_cuda_op_topk(l, V, temp, k, &d, &err) != QF_OK) {
        printf("  V %d kind %d k %d: %s\n", V, kind, k, err.msg);
        return 1;
    }
    const char *why = topk_check(l, V, temp, k, &d, ids);
    if (*why) printf("  V %d kind %d k %d temp %.1f: %s differs\n", V, kind, k, temp, why);
    return *why != 0;
}

/* 300000 at k 256: one merge level; 4500000 (k 256): two */
TEST(op_topk) {
    NEED_GPU();
    const int sizes[] = {1, 5, 1000, 1023, 1024, 1025, 4097, 50000, 128256, 300000};
    const int ks[] = {0, 1, 2, 40, 256};
    int cases = 0, bad = 0;
    uint64_t st = 31;
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
        const int V = sizes[a];
        float *l = malloc((size_t)V * 4);
        int *ids = malloc((size_t)V * sizeof *ids);
        for (int kind = 0; kind < 5; kind++) {
            topk_fill(l, V, kind, &st);
            for (size_t b = 0; b < sizeof ks / sizeof *ks; b++)
                for (int ti = 0; ti < 2; ti++) bad += topk_case(l, V, kind, ti ? 0.8f : 0.0f, ks[b], ids, &cases);
        }
        free(ids);
        free(l);
    }
    const int VB = 4500000;
    float *l = malloc((size_t)VB * 4);
    int *ids = malloc((size_t)VB * sizeof *ids);
    for (int kind = 0; kind < 2; kind++) {
        topk_fill(l, VB, kind, &st);
        bad += topk_case(l, VB, kind, 0.8f, 256, ids, &cases);
        bad += topk_case(l, VB, kind, 0.8f, 40, ids, &cases);
    }
    free(ids);
    free(l);
    printf("  %d of %d rows reduced as the host does\n", cases - bad, cases);
    CHECK_EQ_INT(bad, 0);
}

/* one token at a time on the GPU: decode_topk's reduction of the step's logits against the
 * host's reduction of the same step's logits copied back by qf_decode (the same context,
 * the same token and position twice), on the decode graph, on plain launches and in the
 * canonical arithmetic */
TEST(e2e_decode_topk) {
    NEED_GPU();
    const char *models[] = {"models/qforge-demo-11m-f16.gguf", "models/test-d2048-q4_0.gguf",
                            "models/qforge-demo-qwen2-5m-q4_k_m.gguf"};
    int checked = 0, bad = 0;
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        const int n0 = 9, n1 = 12;
        int32_t toks[21];
        qf_model *m = graph_model(models[mi], toks, n0 + n1);
        if (!m) continue;
        const int nv = qf_model_hparams(m)->n_vocab;
        float *lg = malloc((size_t)nv * 4);
        int *ids = malloc((size_t)nv * sizeof *ids);
        for (int ng = 0; ng < 3; ng++) { /* the graph, plain launches, the canonical arithmetic */
            qf_context_params p = qf_context_default_params();
            p.n_ctx = 64;
            p.device = QF_DEVICE_CUDA;
            p.cuda.no_graph = ng == 1;
            p.canonical = ng == 2;
            qf_error err = {0};
            qf_context *c = qf_context_new(m, &p, &err);
            CHECK_MSG(c, "%s", err.msg);
            if (!c) continue;
            bool ok = qf_decode(c, toks, n0, 0, NULL, n0, &err) == QF_OK;
            for (int i = 0; ok && i < n1; i++) {
                const int pos = n0 + i, k = (int[]){1, 40, 256}[i % 3];
                const float temp = i % 4 == 3 ? 0.0f : 0.7f;
                qf_gpu_topk d;
                ok = qf_decode(c, toks + pos, 1, pos, lg, 0, &err) == QF_OK &&
                     qf_gpu_decode_topk(c, toks[pos], pos, temp, k, &d, &err) == QF_OK;
                if (!ok) break;
                const char *why = topk_check(lg, nv, temp, k, &d, ids);
                if (*why)
                    bad++, printf("  %s%s step %d: %s differs\n", models[mi] + 7,
                                  ng == 1 ? " (launches)" : ng == 2 ? " (canonical)" : "", i, why);
                checked++;
            }
            CHECK_MSG(ok, "%s", err.msg);
            qf_context_free(c);
        }
        free(ids);
        free(lg);
        qf_model_free(m);
    }
    printf("  %d steps: %d reduced on the device as the host reduces the copied logits\n", checked, checked - bad);
    CHECK_EQ_INT(bad, 0);
}

static void gen_text(void *user, const char *text, size_t len) {
    char *b = user;
    const size_t n = strlen(b);
    if (n + len < 4096) memcpy(b + n, text, len), b[n + len] = 0;
}

/* qf_generate on the GPU (the sampler reads decode_topk's reduction) against the loop it
 * replaced on the same device (every step's logits copied back, qf_sample on the host): the
 * same text, greedy and with the CLI's sampling defaults */
TEST(e2e_generate_device_sampler) {
    NEED_GPU();
    const char *path = model_path("models/qforge-demo-11m-f16.gguf");
    if (!path) SKIP("demo model not found");
    const char *prompt = "The kernel scheduler";
    for (int mode = 0; mode < 2; mode++) {
        const qf_sampler_params sp = mode ? (qf_sampler_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 42}
                                          : (qf_sampler_params){.temp = 0.0f};
        qf_run_params rp = qf_run_default_params();
        rp.model_path = path;
        rp.cp.n_ctx = 128;
        rp.cp.device = QF_DEVICE_CUDA;
        qf_run r;
        qf_error err = {0};
        CHECK_MSG(qf_run_open(&rp, &r, &err) == QF_OK, "%s", err.msg);
        if (err.code) return;
        static char a[4096], b[4096];
        a[0] = b[0] = 0;
        qf_generate_params gp = {.n_predict = 40, .sampler = sp, .on_text = gen_text, .user = a};
        qf_generate_stats gs;
        CHECK_MSG(qf_generate(r.ctx, prompt, strlen(prompt), &gp, &gs, &err) == QF_OK, "%s", err.msg);
        /* the loop before: qf_decode copies every row, qf_sample draws on the host */
        const qf_tokenizer *tk = qf_model_tokenizer(r.model);
        const int nv = qf_model_hparams(r.model)->n_vocab;
        int32_t *ids = NULL;
        size_t np = 0;
        float *lg = malloc((size_t)nv * 4);
        qf_sampler smp;
        CHECK(qf_sampler_init(&smp, &sp, nv) == 0);
        CHECK(qf_tokenize(tk, prompt, strlen(prompt), qf_tokenizer_add_bos(tk), false, &ids, &np, &err) == QF_OK);
        gen_text(b, prompt, strlen(prompt));
        bool ok = qf_decode(r.ctx, ids, (int)np, 0, lg, (int)np - 1, &err) == QF_OK;
        int pos = (int)np, ng = 0;
        for (; ok && ng < 40; ng++) {
            int32_t next = qf_sample(&smp, lg);
            if (next == qf_tokenizer_eos(tk)) break;
            char piece[256];
            const int n = qf_token_to_piece(tk, next, false, piece, sizeof piece);
            if (n > 0) gen_text(b, piece, (size_t)n);
            ok = qf_decode(r.ctx, &next, 1, pos++, lg, 0, &err) == QF_OK;
        }
        CHECK_MSG(ok, "%s", err.msg);
        printf("  %s: %d tokens, %s\n    %s\n", mode ? "temp 0.8 top-k 40 top-p 0.95" : "greedy", gs.n_generated,
               strcmp(a, b) ? "DIFFERENT from the host sampler's" : "the host sampler's text", a);
        CHECK_EQ_INT(gs.n_generated, ng);
        CHECK(strcmp(a, b) == 0);
        qf_sampler_free(&smp);
        free(lg);
        free(ids);
        qf_run_close(&r);
    }
}

/* a kv-int8 payload's GPU runs of one case: the graph reading the cache in place (lg; *gs: its
 * graph steps), the graph through the per-step expansion (le, knob i8_expand) and plain launches
 * in place (lp) */
static bool int8_gpu_runs(qf_model *m, const char *kl, const char *vl, const int32_t *toks, int n0, int n1, float *lg,
                          long *gs, float *le, float *lp) {
    bool ok = decode_steps_lay(m, QF_DEVICE_CUDA, false, false, QF_KV_F16, QF_KV_ROT_NONE, kl, vl, toks, n0, n1, lg);
    *gs = last_graph_steps;
    dsl_i8_expand = true;
    ok = ok && decode_steps_lay(m, QF_DEVICE_CUDA, false, false, QF_KV_F16, QF_KV_ROT_NONE, kl, vl, toks, n0, n1, le);
    dsl_i8_expand = false;
    return ok && decode_steps_lay(m, QF_DEVICE_CUDA, false, true, QF_KV_F16, QF_KV_ROT_NONE, kl, vl, toks, n0, n1, lp);
}

/* kv-int8 caches (every row layout, K and V each its own) in one-token steps: the step runs
 * under the decode graph (graph_steps), the graph's logits are the plain launches' bits, and
 * both are within the q8_0 cache's bound of the CPU reference with the same payload. The
 * rotated layouts are attended in their stored basis (H q, the output rotated back), not
 * rotated back row by row: O(1) a step, not O(positions). Split-K reads the int8 rows in place
 * (attn_i8: the 11m models' GQA group of 3 at head_dim 64, test-d2048's 4 at 128); the
 * per-step expansion (knob i8_expand) is printed beside it. */
TEST(e2e_decode_graph_int8) {
    NEED_GPU();
    const char *models[] = {"models/qforge-demo-11m-f16.gguf", "models/qforge-demo-11m-q4_0.gguf",
                            "models/test-d2048-q4_0.gguf"};
    /* ec-rot is staged in shared memory (k_attn_split_i8), the other classes are read straight
     * from global memory (k_attn_split_h's int8 form) unless the other stream is ec-rot */
    const char *lays[][2] = {{"ec-rot", "ec-rot"}, {"token-rot", "token"}, {"static", "static-rot"}, {"static-rot", "ec-rot"}};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        /* an 8-token prompt: MATVEC_MAX, so it runs the decode route too (split-K over 8 queries
         * of a batch); then positions 8..47 a token at a time */
        const int n0 = 8, n1 = 40;
        int32_t toks[48];
        qf_model *m = graph_model(models[mi], toks, n0 + n1);
        if (!m) continue;
        const int nv = qf_model_hparams(m)->n_vocab;
        const size_t nl = (size_t)n1 * nv;
        float *lg = malloc(nl * 4), *lp = malloc(nl * 4), *lc = malloc(nl * 4), *lf = malloc(nl * 4),
              *le = malloc(nl * 4);
        for (size_t k = 0; lg && lp && lc && lf && le && k < sizeof lays / sizeof lays[0]; k++) {
            const char *kl = lays[k][0], *vl = lays[k][1];
            long gs = 0;
            const bool ok = int8_gpu_runs(m, kl, vl, toks, n0, n1, lg, &gs, le, lp) &&
                 decode_steps_lay(m, QF_DEVICE_CPU, true, true, QF_KV_F16, QF_KV_ROT_NONE, kl, vl, toks, n0, n1, lc) &&
                 decode_steps_lay(m, QF_DEVICE_CPU, false, true, QF_KV_F16, QF_KV_ROT_NONE, kl, vl, toks, n0, n1, lf);
            if (!ok) break;
            const graph_cmp r = graph_compare(lg, lp, lc, lf, n1, nv);
            const size_t diff = r.diff;
            const double e = r.e, fe = r.fe, ee = nmse(le, lc, nl);
            const int agree = r.agree, near = r.near;
            printf("  decode graph %-24s int8 K %-9s V %-10s: %ld of %d steps replayed the graph; %zu of %zu logits differ "
                   "from plain launches; nmse %.3g against the CPU reference (the CPU's fast route: %.3g, the per-step "
                   "expansion: %.3g), top-1 %d/%d (%d/%d with near-ties)\n",
                   models[mi] + 7, kl, vl, gs, n1, diff, nl, e, fe, ee, agree, n1, near, n1);
            CHECK_MSG(gs == n1, "%s int8 %s/%s: %ld of %d steps ran the graph", models[mi], kl, vl, gs, n1);
            CHECK_MSG(diff == 0, "%s int8 %s/%s: graph replay differs from plain launches", models[mi], kl, vl);
            const double lb = fmax(1e-4, 2 * fe);
            CHECK_MSG(e <= lb, "%s int8 %s/%s: logits nmse %g (bound %g)", models[mi], kl, vl, e, lb);
            CHECK_MSG(near >= n1 - 2, "%s int8 %s/%s: top-1 %d/%d, %d/%d with near-ties", models[mi], kl, vl, agree, n1,
                      near, n1);
        }
        free(lg), free(lp), free(lc), free(lf), free(le);
        qf_model_free(m);
    }
}

/* The same at positions 2100..2105 of test-d2048 (q4_0, head_dim 128, GQA group 4): split-K
 * ranges of 33 keys, so the in-place kernel stages each range in two tiles, and the first
 * tile's older rows before its wait. Its CPU reference would take minutes, so the bound is the
 * per-step expansion's (knob i8_expand, certified above) distance to the CPU's fast route. */
TEST(e2e_decode_int8_long) {
    NEED_GPU();
    const char *rel = "models/test-d2048-q4_0.gguf";
    const char *lays[][2] = {{"ec-rot", "ec-rot"}, {"token", "token-rot"}, {"static-rot", "static"}, {"token-rot", "static"},
                             {"ec-rot", "token"}};
    enum { n0 = 2100, n1 = 6 };
    static int32_t toks[n0 + n1];
    qf_model *m = graph_model(rel, toks, n0 + n1);
    if (!m) return;
    const int nv = qf_model_hparams(m)->n_vocab;
    const size_t nl = (size_t)n1 * nv;
    float *lg = malloc(nl * 4), *lp = malloc(nl * 4), *le = malloc(nl * 4), *lf = malloc(nl * 4);
    dsl_n_ctx = 2304;
    for (size_t k = 0; lg && lp && le && lf && k < sizeof lays / sizeof lays[0]; k++) {
        const char *kl = lays[k][0], *vl = lays[k][1];
        long gs = 0;
        const bool ok = int8_gpu_runs(m, kl, vl, toks, n0, n1, lg, &gs, le, lp) &&
                        decode_steps_lay(m, QF_DEVICE_CPU, false, true, QF_KV_F16, QF_KV_ROT_NONE, kl, vl, toks, n0, n1, lf);
        if (!ok) break;
        size_t diff = 0;
        for (size_t i = 0; i < nl; i++) diff += memcmp(lg + i, lp + i, 4) != 0;
        const double e = nmse(lg, lf, nl), ee = nmse(le, lf, nl);
        int agree = 0, near = 0;
        for (int t = 0; t < n1; t++) {
            agree += argmax(lg + (size_t)t * nv, nv) == argmax(lf + (size_t)t * nv, nv);
            near += top1_near(lg + (size_t)t * nv, lf + (size_t)t * nv, nv);
        }
        printf("  decode %s at %d..%d, int8 K %-10s V %-9s: %ld of %d steps replayed the graph; %zu of %zu logits differ "
               "from plain launches; nmse %.3g against the CPU's fast route (the per-step expansion: %.3g), top-1 %d/%d "
               "(%d/%d with near-ties)\n",
               rel + 7, n0, n0 + n1 - 1, kl, vl, gs, n1, diff, nl, e, ee, agree, n1, near, n1);
        CHECK_MSG(gs == n1, "int8 %s/%s: %ld of %d steps ran the graph", kl, vl, gs, n1);
        CHECK_MSG(diff == 0, "int8 %s/%s: graph replay differs from plain launches", kl, vl);
        const double lb = fmax(1e-4, 2 * ee);
        CHECK_MSG(e <= lb, "int8 %s/%s: logits nmse %g (bound %g)", kl, vl, e, lb);
        CHECK_MSG(near >= n1 - 1, "int8 %s/%s: top-1 %d/%d, %d/%d with near-ties", kl, vl, agree, n1, near, n1);
    }
    dsl_n_ctx = 256;
    free(lg), free(lp), free(le), free(lf);
    qf_model_free(m);
}

/* --kv-rot hadamard, q8_0 / q4_0 caches: GPU PPL within 0.1% of the CPU with the same rotation,
 * measured with every GEMM in f32 (QF_CUDA_GEMM=f32), which isolates the rotation itself. The
 * default route (f16 GEMM inputs) is bounded at 0.5%: with q4_0 K and V, its input rounding
 * moves whole quantization steps in later layers (qforge-demo-11m-f16: 2.3e-3 with the default
 * route, 1.7e-4 with f32 GEMMs, 2.6e-4 with -b 8, i.e. the decode route; K alone or V alone in
 * q4_0: 2.2e-4 / 1.5e-4; H200, see docs/gpu.md). SKIPs while the CPU cache does not rotate. */
TEST(e2e_kv_rot) {
    NEED_GPU();
    const char *cp = test_data("corpora/kerneldoc-demo/docs.txt");
    if (!cp) SKIP("corpora/kerneldoc-demo/docs.txt not found");
    size_t len = 0;
    char *text = read_text(cp, &len);
    if (!text) SKIP("cannot read the corpus");
    const char *models[] = {"models/qforge-demo-11m-f16.gguf", "models/qforge-demo-11m-q4_k_m.gguf"};
    bool cpu_rotates = true;
    for (size_t i = 0; i < 2 && cpu_rotates; i++) {
        const char *path = model_path(models[i]);
        if (!path) continue;
        qf_error err = {0};
        qf_model *m = qf_model_load(path, &err);
        if (!m) continue;
        qf_kv_mode kvs[] = {QF_KV_Q4_0, QF_KV_Q8_0};
        for (int k = 0; k < 2; k++) {
            double tc, tg, t0;
            ppl_rot = QF_KV_ROT_NONE;
            double p0 = ppl_of(m, QF_DEVICE_CPU, kvs[k], text, len, &t0);
            double g0 = ppl_of(m, QF_DEVICE_CUDA, kvs[k], text, len, &t0);
            ppl_rot = QF_KV_ROT_HADAMARD;
            double pc = ppl_of(m, QF_DEVICE_CPU, kvs[k], text, len, &tc);
            double pg = ppl_of(m, QF_DEVICE_CUDA, kvs[k], text, len, &tg);
            ppl_gemm_f32 = ppl_attn_warp = true; /* the all-f32 route */
            double pg32 = ppl_of(m, QF_DEVICE_CUDA, kvs[k], text, len, &t0);
            ppl_gemm_f32 = ppl_attn_warp = false;
            ppl_rot = QF_KV_ROT_NONE;
            double rel = fabs(pg / pc - 1), rel32 = fabs(pg32 / pc - 1);
            printf("  PPL %-28s kv %-4s: no rotation CPU %.4f GPU %.4f; --kv-rot hadamard CPU %.4f, GPU %.4f (%.0f tok/s), "
                   "rel diff %.2e; GPU with f32 GEMMs %.4f, rel diff %.2e\n",
                   models[i] + 7, qf_kv_mode_name(kvs[k]), p0, g0, pc, pg, tg, rel, pg32, rel32);
            if (pc == p0) {
                cpu_rotates = false;
                break;
            }
            CHECK_MSG(rel32 < 1e-3 + cpu_gpu_slack(models[i], kvs[k]), "PPL %s kv %s rot, f32 GEMMs: CPU %f vs GPU %f", models[i], qf_kv_mode_name(kvs[k]), pc,
                      pg32);
            CHECK_MSG(rel < 5e-3 + cpu_gpu_slack(models[i], kvs[k]), "PPL %s kv %s rot: CPU %f vs GPU %f", models[i], qf_kv_mode_name(kvs[k]), pc, pg);
        }
        qf_model_free(m);
    }
    free(text);
    if (!cpu_rotates) SKIP("the CPU cache does not honour --kv-rot yet (its PPL equals the unrotated one): GPU rows printed above");
}

/* kv-int8 / kv-dict artifacts (certified for qforge-demo-11m-f16 by qforge calibrate) bound on
 * the GPU: PPL within 0.1% of the CPU with the same artifact. QF_TEST_ARTIFACTS names a
 * folder with int8.qfa and dict.qfa. */
TEST(e2e_artifacts) {
    NEED_GPU();
    const char *dir = getenv("QF_TEST_ARTIFACTS");
    if (!dir) SKIP("QF_TEST_ARTIFACTS (a folder with int8.qfa, dict.qfa for qforge-demo-11m-f16) is not set");
    const char *cp = test_data("corpora/kerneldoc-demo/docs.txt");
    size_t len = 0;
    char *text = cp ? read_text(cp, &len) : NULL; /* before model_path: test_data reuses its buffer */
    const char *path = model_path("models/qforge-demo-11m-f16.gguf");
    if (!text || !path) {
        free(text);
        SKIP("corpus or demo model not found");
    }
    qf_error err = {0};
    qf_model *m = qf_model_load(path, &err);
    CHECK(text && m);
    const char *names[] = {"int8.qfa", "dict.qfa"};
    for (int i = 0; m && text && i < 2; i++) {
        char ap[4096];
        snprintf(ap, sizeof ap, "%s/%s", dir, names[i]);
        qf_artifact art = {0};
        if (qf_artifact_load(ap, qf_model_sha256(m), NULL, &art, &err)) {
            CHECK_MSG(0, "%s: %s", ap, err.msg);
            continue;
        }
        double tc, tg, tw;
        double pc = ppl_of_art(m, QF_DEVICE_CPU, QF_KV_F16, &art, text, len, &tc);
        double pg = ppl_of_art(m, QF_DEVICE_CUDA, QF_KV_F16, &art, text, len, &tg); /* prefill: flash kernel */
        ppl_attn_warp = true;
        double pw = ppl_of_art(m, QF_DEVICE_CUDA, QF_KV_F16, &art, text, len, &tw); /* prefill: warp kernel */
        ppl_attn_warp = false;
        double rel = fabs(pg / pc - 1), relw = fabs(pw / pc - 1);
        printf("  PPL with %s (%s): CPU %.4f (%.0f tok/s), GPU %.4f (%.0f tok/s), rel diff %.2e; GPU with warp "
               "attention %.4f (%.0f tok/s), rel diff %.2e\n",
               names[i], qf_artifact_kind_name(art.cert.kind), pc, tc, pg, tg, rel, pw, tw, relw);
        CHECK_MSG(relw < (art.cert.kind == QF_ARTIFACT_KV_DICT ? 1e-2 : 1e-3), "artifact %s, warp: CPU %f vs GPU %f",
                  names[i], pc, pw);
        /* int8: 0.1%. dict: OMP picks atoms by argmax |<atom, x>|, so any route-level noise in
         * K changes some codes (the decode itself is exact, op_kv_int8_dict). With K/V projected
         * in f32 the GPU is 0.7% off the CPU over 6 chunks (1.7% with f16 GEMM inputs; the CPU's
         * own reference route is 0.03-0.06% off its fast route): dict is NOT at the 0.1% target,
         * and its bound here is 1% */
        double bound = art.cert.kind == QF_ARTIFACT_KV_DICT ? 1e-2 : 1e-3;
        CHECK_MSG(rel < bound, "artifact %s: CPU %f vs GPU %f", names[i], pc, pg);
        qf_artifact_free(&art);
    }
    qf_model_free(m);
    free(text);
}

/* ---- the canonical arithmetic (kernels/canon.h): the CPU's bits on the GPU ---- */

/* forward.c's canonical matmul on the CPU, with the scalar oracles: the integer GEMMs for the
 * types they know, the f32 chain over the reference dequantization for the others */
static void canon_matmul_cpu(qf_type t, const void *w, int K, int N, const float *x, int n, float *y) {
    const size_t rb = qf_row_bytes(t, K);
    if (qf_gemm_q8_type(t) || qf_gemm_k_type(t)) {
        const bool kq = qf_gemm_k_type(t);
        const size_t stride = kq ? qf_gemm_k_act_stride(K) : qf_gemm_act_stride(K);
        uint8_t *act = malloc(stride * n), *tmp = malloc((size_t)K * 4 + 1024);
        if (kq) {
            qf_gemm_k_quantize_act(x, K, 0, n, act, tmp);
            qf_gemm_k_rows_ref(t, w, rb, K, 0, N, act, n, y, N);
        } else {
            qf_gemm_quantize_act(t, x, K, 0, n, act, tmp);
            qf_gemm_q8_rows_ref(t, w, rb, K, 0, N, act, n, y, N);
        }
        free(act), free(tmp);
        return;
    }
    float *wf = malloc(sizeof(float) * (size_t)K * N);
    for (int r = 0; r < N; r++) qf_dequantize_row_ref(t, (const uint8_t *)w + (size_t)r * rb, wf + (size_t)r * K, K);
    qf_canon_gemm_rows_ref(wf, K, N, x, n, y, N);
    free(wf);
}

/* every weight type: the GPU's canonical GEMM (QF_CUDA_MM_CANON) equals the CPU's bit for bit;
 * K 512 / 2304 (q4_0 and q8_0 in their G8 layouts on the device), 800 (the 32-block types, GGUF layout) and
 * 2048 (Q6_K in its G8 layout too), rows and tokens across the tiles' edges */
TEST(op_canon_matmul) {
    NEED_GPU();
    const int Ks[] = {512, 2304, 800, 2048}, N = 150, ns[] = {1, 5, 70};
    for (size_t ti = 0; ti < 4 * N_TYPES; ti++) {
        const int K = Ks[ti / N_TYPES];
        const qf_type t = all_types[ti % N_TYPES];
        if (K % qf_type_block_elems(t)) continue;
        void *w = rand_weight(t, N, K);
        qf_weight qw = {.type = t, .ne0 = K, .ne1 = N, .row_bytes = qf_row_bytes(t, K), .data = w};
        for (int ni = 0; ni < 3; ni++) {
            const int n = ns[ni];
            float *x = malloc(sizeof(float) * n * K), *ref = malloc(sizeof(float) * n * N), *got = malloc(sizeof(float) * n * N);
            for (int i = 0; i < n * K; i++) x[i] = frand() * 3.0f;
            canon_matmul_cpu(t, w, K, N, x, n, ref);
            qf_error err = {0};
            CHECK_MSG(qf_cuda_op_matmul(&qw, x, n, got, QF_CUDA_MM_CANON, &err) == QF_OK, "%s", err.msg);
            size_t diff = 0;
            for (int i = 0; i < n * N; i++) diff += memcmp(&got[i], &ref[i], 4) != 0;
            if (diff || ni == 2) printf("  canonical GEMM %-5s K %4d n %2d: %zu of %d outputs differ\n", qf_type_name(t), K, n, diff, n * N);
            CHECK_MSG(diff == 0, "canonical GEMM %s K %d n %d: %zu outputs differ", qf_type_name(t), K, n, diff);
            free(x), free(ref), free(got);
        }
        free(w);
    }
}

/* Everything a forward pass hands its tap, every position: post-RoPE K, V, and the four
 * activation sites [layer][pos][dim] */
typedef struct {
    int n_layer, n_ctx, dims[6], pos0;
    float *a[6]; /* 0 ATTN_IN, 1 ATTN_OUT, 2 FFN_IN, 3 FFN_DOWN (qf_act_site), 4 K, 5 V */
} full_cap;
static void fc_put(full_cap *c, int s, int layer, int n_tok, const float *x) {
    memcpy(c->a[s] + ((size_t)layer * c->n_ctx + c->pos0) * c->dims[s], x, sizeof(float) * n_tok * c->dims[s]);
}
static void fc_kv(void *user, int layer, int pos0, int n_tok, int nkv, int hd, const float *k, const float *v) {
    (void)pos0, (void)nkv, (void)hd;
    fc_put(user, 4, layer, n_tok, k), fc_put(user, 5, layer, n_tok, v);
}
static void fc_act(void *user, int layer, qf_act_site site, int n_tok, int dim, const float *x) {
    (void)dim;
    fc_put(user, (int)site, layer, n_tok, x);
}

/* prefill n0 tokens, then n1 one at a time, in the canonical arithmetic on dev (art bound, when
 * given, instead of the kv cache mode); logits of every token */
static bool canon_seq(qf_model *m, qf_device dev, qf_kv_mode kv, qf_kv_rot rot, const qf_artifact *art,
                      const int32_t *toks, int n0, int n1, float *logits, full_cap *cap) {
    qf_context_params p = qf_context_default_params();
    p.n_ctx = cap->n_ctx, p.kv_k = p.kv_v = kv, p.kv_rot = rot, p.device = dev, p.canonical = true, p.n_threads = 2;
    qf_error err = {0};
    qf_context *c = qf_context_new(m, &p, &err);
    CHECK_MSG(c, "%s", err.msg);
    if (!c) return false;
    bool ok = !art || qf_context_bind_artifact(c, art, &err) == QF_OK;
    CHECK_MSG(ok, "binding on %s: %s", qf_device_name(dev), err.msg);
    CHECK(qf_context_device(c) == dev && qf_context_canonical(c));
    qf_tap tap = {.user = cap, .on_kv = fc_kv, .on_act = fc_act};
    qf_context_set_tap(c, &tap);
    const int nv = qf_model_hparams(m)->n_vocab;
    cap->pos0 = 0;
    ok = ok && qf_decode(c, toks, n0, 0, logits, 0, &err) == QF_OK;
    for (int i = 0; ok && i < n1; i++) {
        cap->pos0 = n0 + i;
        ok = qf_decode(c, toks + n0 + i, 1, n0 + i, logits + (size_t)(n0 + i) * nv, 0, &err) == QF_OK;
    }
    CHECK_MSG(ok, "%s", err.msg);
    qf_context_free(c);
    return ok;
}

/* the CPU's and the GPU's canonical forward passes (n0-token prefill, n1 steps, a context of
 * n_ctx; art bound when given), bit for bit: logits and every tapped value; on a difference, the
 * first (layer, site) where it appears */
static void canon_model(qf_model *m, const char *name, qf_kv_mode kv, qf_kv_rot rot, const qf_artifact *art, int n_ctx,
                        int n0, int n1) {
    const qf_hparams *hp = qf_model_hparams(m);
    const int n = n0 + n1, nv = hp->n_vocab, L = hp->n_layer;
    int32_t *toks = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * (nv - 1));
    full_cap cap[2];
    const int dims[6] = {hp->n_embd, hp->n_head * hp->head_dim, hp->n_embd, hp->n_ff, hp->n_head_kv * hp->head_dim,
                         hp->n_head_kv * hp->head_dim};
    float *lg[2];
    for (int d = 0; d < 2; d++) {
        cap[d].n_layer = L, cap[d].n_ctx = n_ctx;
        for (int s = 0; s < 6; s++) cap[d].dims[s] = dims[s], cap[d].a[s] = calloc((size_t)L * n_ctx * dims[s], 4);
        lg[d] = calloc((size_t)n * nv, 4);
    }
    bool ok = canon_seq(m, QF_DEVICE_CPU, kv, rot, art, toks, n0, n1, lg[0], &cap[0]) &&
              canon_seq(m, QF_DEVICE_CUDA, kv, rot, art, toks, n0, n1, lg[1], &cap[1]);
    if (ok) {
        static const char *const site[6] = {"attn_in", "attn_out", "ffn_in", "ffn_down", "K", "V"};
        int fl = -1, fs = -1;
        size_t ndiff = 0;
        for (int l = 0; l < L && fl < 0; l++)
            for (int s = 0; s < 6; s++) {
                const size_t off = (size_t)l * n_ctx * dims[s], cnt = (size_t)n * dims[s];
                size_t dd = 0;
                for (size_t i = 0; i < cnt; i++) dd += memcmp(&cap[0].a[s][off + i], &cap[1].a[s][off + i], 4) != 0;
                if (dd && fl < 0) fl = l, fs = s, ndiff = dd;
            }
        size_t dlog = 0;
        for (size_t i = 0; i < (size_t)n * nv; i++) dlog += memcmp(&lg[0][i], &lg[1][i], 4) != 0;
        printf("  %-36s kv %-4s%-4s logits: %zu of %zu differ", name, art ? "art" : qf_kv_mode_name(kv), rot ? "+had" : "",
               dlog, (size_t)n * nv);
        if (fl >= 0) printf("; first difference: layer %d %s (%zu values)", fl, site[fs], ndiff);
        printf("\n");
        CHECK_MSG(dlog == 0 && fl < 0, "%s kv %s: the GPU's canonical pass differs from the CPU's", name, qf_kv_mode_name(kv));
    }
    for (int d = 0; d < 2; d++) {
        for (int s = 0; s < 6; s++) free(cap[d].a[s]);
        free(lg[d]);
    }
    free(toks);
}

TEST(e2e_canonical) {
    NEED_GPU();
    const char *names[] = {"models/qforge-demo-11m-f16.gguf", "models/qforge-demo-11m-q8_0.gguf",
                           "models/qforge-demo-11m-q4_k_m.gguf", "models/qforge-demo-qwen2-5m-f16.gguf",
                           "models/qforge-demo-qwen2-5m-q4_k_m.gguf", "models/qforge-demo-27m-hd128-f16.gguf"};
    int ran = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *path = model_path(names[i]);
        if (!path) {
            printf("  %s: not found, skipped\n", names[i]);
            continue;
        }
        qf_error err = {0};
        qf_model *m = qf_model_load(path, &err);
        CHECK_MSG(m, "%s", err.msg);
        if (!m) continue;
        ran++;
        canon_model(m, names[i] + 7, QF_KV_F16, QF_KV_ROT_NONE, NULL, 64, 40, 4);
        if (i == 0 || i == 5) { /* the cache modes on the demo models */
            canon_model(m, names[i] + 7, QF_KV_F32, QF_KV_ROT_NONE, NULL, 64, 40, 4);
            canon_model(m, names[i] + 7, QF_KV_Q8_0, QF_KV_ROT_NONE, NULL, 64, 40, 4);
            canon_model(m, names[i] + 7, QF_KV_Q4_0, QF_KV_ROT_HADAMARD, NULL, 64, 40, 4);
        }
        if (i == 0) { /* q4_0 weights: the demo model quantized here */
            char q4[4096];
            snprintf(q4, sizeof q4, "%s/canon-q4_0.gguf", test_tmpdir());
            qf_model *m4 = qf_quantize_model(path, q4, QF_TYPE_Q4_0, &err) == QF_OK ? qf_model_load(q4, &err) : NULL;
            CHECK_MSG(m4, "%s", err.msg);
            if (m4) canon_model(m4, "qforge-demo-11m q4_0 (quantized here)", QF_KV_Q8_0, QF_KV_ROT_NONE, NULL, 64, 40, 4);
            qf_model_free(m4);
        }
        qf_model_free(m);
    }
    /* QF_CANON_MODELS=A.gguf:B.gguf: more models (the GPU machine's bench/gen_model_shapes files,
     * e.g. two layers of the Llama-3-8B shape in q4_0 and q4_k_m: head_dim 128, GQA 4) */
    const char *extra = getenv("QF_CANON_MODELS");
    char list[4096];
    snprintf(list, sizeof list, "%s", extra ? extra : "");
    for (char *sv = NULL, *path = strtok_r(list, ":", &sv); path; path = strtok_r(NULL, ":", &sv)) {
        qf_error err = {0};
        qf_model *m = qf_model_load(path, &err);
        CHECK_MSG(m, "%s", err.msg);
        if (!m) continue;
        ran++;
        canon_model(m, path, QF_KV_F16, QF_KV_ROT_NONE, NULL, 64, 40, 4);
        canon_model(m, path, QF_KV_Q8_0, QF_KV_ROT_HADAMARD, NULL, 64, 40, 4);
        qf_model_free(m);
    }
    if (!ran) SKIP("no demo model found");
}

/* ---- the certificate, CPU vs GPU (issue 16 item 3) ---- */

/* one kv-int8 calibration of qforge-demo-11m-f16 (the docs/gpu.md run: -c 256, 4096 calibration
 * tokens, 4 evaluation chunks) with capture and certification on `dev`; its certificate and
 * payload SHA-256 from the written artifact */
/* the certificate tests' inputs: the demo model and the kerneldoc corpus (paths of 4096 bytes);
 * NULL, or why they are missing */
static const char *cert_inputs(char *model, char *corpus) {
    const char *p = model_path("models/qforge-demo-11m-f16.gguf");
    if (!p) return "demo model not found";
    snprintf(model, 4096, "%s", p);
    if (!(p = test_data("corpora/kerneldoc-demo/docs.txt"))) return "corpora/kerneldoc-demo/docs.txt not found";
    snprintf(corpus, 4096, "%s", p);
    return NULL;
}

static bool cert_run_kind(const char *model, const char *corpus, qf_device dev, const char *out, qf_certificate *cert,
                          qf_artifact_kind kind) {
    qf_job j;
    qf_job_default(&j);
    const char *paths[1] = {corpus};
    j.model_path = model;
    j.kind = kind;
    if (kind == QF_ARTIFACT_KV_DICT) { /* a small dictionary, gated loosely: the device is what is checked */
        j.dict_atoms = 256, j.dict_sparsity = 16, j.dict_iters = 4, j.dict_coef = QF_KV_COEF_Q8;
        j.gate.max_delta_ppl = 1.0, j.gate.has_max_kld = true, j.gate.max_kld = 1.0;
        j.gate.has_max_kld_p99 = true, j.gate.max_kld_p99 = 10.0, j.gate.vs_baseline = false;
    }
    j.corpus_paths = paths;
    j.n_corpus_paths = 1;
    j.n_ctx = 256;
    j.max_calib_tokens = 4096;
    j.eval_chunks = 4;
    j.n_threads = 2;
    j.capture_device = dev;
    j.out_path = out;
    qf_job_report rep;
    qf_error err = {0};
    qf_status st = qf_job_run(&j, &rep, &err);
    CHECK_MSG(st == QF_OK, "calibrate on %s: %s", qf_device_name(dev), err.msg);
    qf_job_report_free(&rep);
    if (st) return false;
    qf_artifact a = {0};
    if (qf_artifact_load(out, NULL, NULL, &a, &err)) {
        CHECK_MSG(0, "%s: %s", out, err.msg);
        return false;
    }
    *cert = a.cert;
    memset(&a.cert.config, 0, sizeof a.cert.config); /* moved to *cert */
    qf_artifact_free(&a);
    return true;
}
static bool cert_run(const char *model, const char *corpus, qf_device dev, const char *out, qf_certificate *cert) {
    return cert_run_kind(model, corpus, dev, out, cert, QF_ARTIFACT_KV_INT8);
}

/* the measured (gated) numbers: recorded at QF_CERT_SIG_DIGITS_INT8 significant digits */
static bool cert_measured(const char *key) {
    return !strncmp(key, "delta_ppl.", 10) || !strncmp(key, "ctx.", 4) || !strncmp(key, "baseline.", 9);
}

/* x at d significant digits, as certify.c rounds what the gate judges */
static double cert_round(double x, int d) {
    if (!isfinite(x) || x == 0) return x;
    char buf[64];
    snprintf(buf, sizeof buf, "%.*e", d - 1, x);
    return strtod(buf, NULL);
}

static int cert_ndiff, cert_nsame, cert_nmeas_diff;
static bool cert_exact; /* both certificates say arith = canonical: every number must be identical */
/* measured numbers count as the same when equal at the precision the gate judged them at, or,
 * in the canonical arithmetic, when equal */
static void cert_num(const char *key, double c, double g, bool measured) {
    if (measured && !cert_exact) c = cert_round(c, QF_CERT_SIG_DIGITS_INT8), g = cert_round(g, QF_CERT_SIG_DIGITS_INT8);
    if (cert_exact) measured = false; /* a difference is a failure */
    bool same = c == g || (isnan(c) && isnan(g));
    cert_nsame += same, cert_ndiff += !same;
    if (same) return;
    printf("  differs: %-34s CPU %.9g  GPU %.9g%s\n", key, c, g, measured ? "  (measured)" : "");
    if (!measured) {
        CHECK_MSG(0, "certificate field %s: CPU %.9g vs GPU %.9g", key, c, g);
        return;
    }
    cert_nmeas_diff++;
    /* how far the devices' numbers may drift (docs/gpu.md): int8 rounding flips of K/V values that
     * sit within an ulp of a step boundary move KLD by ~0.1..3% and ΔPPL by ~2e-4 on the demo model;
     * a p99 is ~10 tokens of the 1024 scored, the ones such flips move most: 20% (the free
     * baseline's was 8% apart before the CPU's f16 GEMM changed its summation order, 15% after) */
    double tol = (strstr(key, "p99") ? 0.2 : 0.1) * fmax(fabs(c), fabs(g)) + 5e-4 * (strstr(key, "ppl") != NULL);
    CHECK_MSG(fabs(c - g) <= tol, "certificate field %s: CPU %.9g vs GPU %.9g (tolerance %.3g)", key, c, g, tol);
}
static void cert_str(const char *key, const char *c, const char *g) {
    bool same = !strcmp(c, g);
    cert_nsame += same, cert_ndiff += !same;
    if (!same) printf("  differs: %-34s CPU \"%s\"  GPU \"%s\"\n", key, c, g);
    CHECK_MSG(same, "certificate field %s: CPU \"%s\" vs GPU \"%s\"", key, c, g);
}

/* `qforge calibrate --artifact kv-int8` with --device cpu and --device cuda: the two
 * certificates field by field. Every field except the timings (created_utc) and the recorded
 * device (certify_device, cpu_recheck_*) must be identical: in the canonical arithmetic (both
 * record arith = canonical) the measured numbers too, at full precision, and the learned
 * payload; otherwise the measured numbers at the 3 significant digits the gate judges them at,
 * within a drift bound. */
TEST(e2e_certificate) {
    NEED_GPU();
    char model[4096], corpus[4096], pc[4096], pg[4096];
    const char *why = cert_inputs(model, corpus);
    if (why) SKIP(why);
    snprintf(pc, sizeof pc, "%s/cert_cpu.qfa", test_tmpdir());
    snprintf(pg, sizeof pg, "%s/cert_gpu.qfa", test_tmpdir());
    qf_certificate c, g;
    memset(&c, 0, sizeof c), memset(&g, 0, sizeof g);
    if (!cert_run(model, corpus, QF_DEVICE_CPU, pc, &c) || !cert_run(model, corpus, QF_DEVICE_CUDA, pg, &g)) {
        qf_payload_free(&c.config), qf_payload_free(&g.config);
        return;
    }
    cert_ndiff = cert_nsame = cert_nmeas_diff = 0;
    {
        const char *ac = qf_payload_get_string(&c.config, "arith"), *ag = qf_payload_get_string(&g.config, "arith");
        cert_exact = ac && ag && !strcmp(ac, "canonical") && !strcmp(ag, "canonical");
        printf("  arith: CPU %s, GPU %s\n", ac ? ac : "(none)", ag ? ag : "(none)");
        CHECK(cert_exact); /* the demo model and kv-int8 are covered */
    }
    cert_num("kind", c.kind, g.kind, false);
    cert_num("model_sha256", memcmp(c.model_sha256, g.model_sha256, 32), 0, false);
    cert_str("model_name", c.model_name, g.model_name);
    cert_str("model_arch", c.model_arch, g.model_arch);
    cert_num("corpus_sha256", memcmp(c.corpus_sha256, g.corpus_sha256, 32), 0, false);
    cert_num("corpus_docs", (double)c.corpus_docs, (double)g.corpus_docs, false);
    cert_num("calib_docs", (double)c.calib_docs, (double)g.calib_docs, false);
    cert_num("eval_docs", (double)c.eval_docs, (double)g.eval_docs, false);
    cert_str("split", c.split, g.split);
    cert_num("calib_tokens", (double)c.calib_tokens, (double)g.calib_tokens, false);
    cert_num("eval_tokens", (double)c.eval_tokens, (double)g.eval_tokens, false);
    cert_str("engine_version", c.engine_version, g.engine_version);
    cert_str("engine_commit", c.engine_commit, g.engine_commit);
    cert_num("ref_ppl", c.ref_ppl, g.ref_ppl, true);
    cert_num("cand_ppl", c.cand_ppl, g.cand_ppl, true);
    cert_num("delta_ppl", c.delta_ppl, g.delta_ppl, true);
    cert_num("kld_mean", c.kld_mean, g.kld_mean, true);
    cert_num("kld_p99", c.kld_p99, g.kld_p99, true);
    cert_num("top1_agreement", c.top1_agreement, g.top1_agreement, true);
    cert_num("gate_max_delta_ppl", c.gate_max_delta_ppl, g.gate_max_delta_ppl, false);
    cert_num("gate_has_max_kld", c.gate_has_max_kld, g.gate_has_max_kld, false);
    cert_num("gate_max_kld", c.gate_max_kld, g.gate_max_kld, false);
    cert_num("gate_has_min_top1", c.gate_has_min_top1, g.gate_has_min_top1, false);
    cert_num("gate_min_top1", c.gate_min_top1, g.gate_min_top1, false);
    cert_num("passed", c.passed, g.passed, false);
    /* the learned payload: the capture ran on each device */
    bool pay = !memcmp(c.payload_sha256, g.payload_sha256, 32);
    printf("  payload (learned scales): %s\n", pay ? "identical" : "differs (the capture ran on each device)");
    CHECK(pay || !cert_exact);
    /* config, by name: the GPU adds certify_device and the CPU re-check of its first chunk */
    for (size_t i = 0; i < g.config.n; i++) {
        const qf_payload_entry *e = &g.config.entries[i];
        if (!strcmp(e->name, "certify_device") || !strncmp(e->name, "cpu_recheck_", 12)) {
            if (cert_exact && !strcmp(e->name, "cpu_recheck_chunk0_rel_diff")) CHECK(e->f == 0);
            printf("  GPU only: %s = ", e->name);
            if (e->type == QF_PAYLOAD_STRING) printf("%s\n", e->str);
            else printf("%.9g\n", e->f);
            continue;
        }
        const qf_payload_entry *ce = qf_payload_get(&c.config, e->name);
        CHECK_MSG(ce && ce->type == e->type, "config %s: missing or of another type on the CPU", e->name);
        if (!ce || ce->type != e->type) continue;
        if (e->type == QF_PAYLOAD_STRING) cert_str(e->name, ce->str, e->str);
        else if (e->type == QF_PAYLOAD_INT) cert_num(e->name, (double)ce->i, (double)e->i, false);
        else if (e->type == QF_PAYLOAD_FLOAT) cert_num(e->name, ce->f, e->f, cert_measured(e->name));
    }
    for (size_t i = 0; i < c.config.n; i++)
        CHECK_MSG(qf_payload_get(&g.config, c.config.entries[i].name), "config %s: missing on the GPU",
                  c.config.entries[i].name);
    printf("  certificate CPU vs GPU: %d fields identical, %d differ (%d of them measured numbers, at %d significant "
           "digits)\n",
           cert_nsame, cert_ndiff, cert_nmeas_diff, QF_CERT_SIG_DIGITS_INT8);
    qf_payload_free(&c.config), qf_payload_free(&g.config);
}

/* kv-dict v1 certified under --device cuda (issue 16 item 3): the reference, candidate and free
 * baseline passes run on the GPU (its rows OMP-encoded on the device, the host encoder's
 * bytes), the certificate records arith "device", the GPU and the CPU re-check of its first
 * chunk; its numbers follow the CPU's run of the same job to the dictionary's precision (the
 * capture ran on each device, so the dictionaries themselves may differ) */
TEST(e2e_certificate_dict) {
    NEED_GPU();
    char model[4096], corpus[4096], pc[4096], pg[4096];
    const char *why = cert_inputs(model, corpus);
    if (why) SKIP(why);
    snprintf(pc, sizeof pc, "%s/dict_cpu.qfa", test_tmpdir());
    snprintf(pg, sizeof pg, "%s/dict_gpu.qfa", test_tmpdir());
    qf_certificate c, g;
    memset(&c, 0, sizeof c), memset(&g, 0, sizeof g);
    double t0 = qf_now_sec();
    const bool okc = cert_run_kind(model, corpus, QF_DEVICE_CPU, pc, &c, QF_ARTIFACT_KV_DICT);
    const double tc = qf_now_sec() - t0;
    t0 = qf_now_sec();
    const bool okg = okc && cert_run_kind(model, corpus, QF_DEVICE_CUDA, pg, &g, QF_ARTIFACT_KV_DICT);
    const double tg = qf_now_sec() - t0;
    if (okc && okg) {
        const char *ag = qf_payload_get_string(&g.config, "arith"), *dv = qf_payload_get_string(&g.config, "certify_device");
        const qf_payload_entry *rd = qf_payload_get(&g.config, "cpu_recheck_chunk0_rel_diff");
        printf("  kv-dict certificate: CPU %.1f s, GPU %.1f s; GPU arith %s, certify_device %s, chunk-0 CPU re-check "
               "rel. diff %.3g\n", tc, tg, ag ? ag : "(none)", dv ? dv : "(none)", rd ? rd->f : -1.0);
        printf("  ref PPL %.6f / %.6f, candidate %.6f / %.6f, KLD mean %.6f / %.6f, p99 %.6f / %.6f, top-1 %.4f / "
               "%.4f (CPU / GPU)\n", c.ref_ppl, g.ref_ppl, c.cand_ppl, g.cand_ppl, c.kld_mean, g.kld_mean, c.kld_p99,
               g.kld_p99, c.top1_agreement, g.top1_agreement);
        CHECK(ag && !strcmp(ag, "device")); /* the reference is canonical, the OMP codes are not */
        CHECK(dv != NULL);
        CHECK_MSG(rd && rd->f <= 1e-2, "the CPU re-check of the first chunk differs by %g", rd ? rd->f : -1.0);
        CHECK_MSG(fabs(g.ref_ppl / c.ref_ppl - 1) <= 1e-3, "reference PPL %g (GPU) vs %g (CPU)", g.ref_ppl, c.ref_ppl);
        CHECK_MSG(fabs(g.cand_ppl / c.cand_ppl - 1) <= 2e-2, "candidate PPL %g (GPU) vs %g (CPU)", g.cand_ppl, c.cand_ppl);
        CHECK_MSG(fabs(g.kld_mean / c.kld_mean - 1) <= 0.1, "KLD mean %g (GPU) vs %g (CPU)", g.kld_mean, c.kld_mean);
        CHECK(c.passed == g.passed);
    }
    qf_payload_free(&c.config), qf_payload_free(&g.config);
}

/* ---- kv-rq on the GPU (issue 16 item 2: the new kinds) ----
 * An artifact is calibrated on the CPU (small settings), then bound to a CPU and a GPU context.
 * The GPU stores the host encoder's rows (the host cache encodes what the GPU computed) and
 * decodes them on the device (k_kv_rq_expand: the host decoder's operations in its order), with
 * the exact sinks / window chosen per (query, key) as forward.c does. Checked: PPL against the
 * CPU over the certified context (prefill: the warp kernel over both views), and one-token
 * decode steps (split-K with the exact rows written over the stored ones) against the CPU's
 * steps and against the GPU's own batched pass over the same tokens. */
/* transform: qf_job.rq_transform (-1: the default, format 3 with a budget; 0: the Hadamard rows) */
static bool rq_calibrate_on(const char *model, const char *corpus, double bits, int prerope, int transform, int n_ctx,
                            const char *out, qf_device dev) {
    qf_job j;
    qf_job_default(&j);
    const char *paths[1] = {corpus};
    j.model_path = model;
    j.kind = QF_ARTIFACT_KV_RQ;
    j.corpus_paths = paths;
    j.n_corpus_paths = 1;
    j.n_ctx = n_ctx;
    j.max_calib_tokens = 4096;
    j.eval_chunks = 2;
    j.n_threads = 8;
    j.rq_bits = bits;
    j.rq_prerope = prerope;
    j.rq_transform = transform;
    j.capture_device = dev;
    j.out_path = out;
    qf_job_report rep;
    qf_error err = {0};
    qf_status st = qf_job_run(&j, &rep, &err);
    CHECK_MSG(st == QF_OK, "kv-rq calibrate (%s, %.1f bits) on %s: %s", model, bits, qf_device_name(dev), err.msg);
    qf_job_report_free(&rep);
    return st == QF_OK;
}
static bool rq_calibrate(const char *model, const char *corpus, double bits, int prerope, int transform, int n_ctx,
                         const char *out) {
    return rq_calibrate_on(model, corpus, bits, prerope, transform, n_ctx, out, QF_DEVICE_CPU);
}

static bool rq_gemm_f32;  /* the GPU contexts' GEMMs in f32 (qf_cuda_params.gemm_f32) */
static bool rq_attn_warp; /* and prefill attention on the warp kernel instead of the flash route */
static qf_context *rq_context(qf_model *m, qf_device dev, const qf_artifact *art, int n_ctx) {
    qf_context_params p = qf_context_default_params();
    p.n_ctx = n_ctx;
    p.cuda.gemm_f32 = rq_gemm_f32;
    p.cuda.attn_warp = rq_attn_warp;
    p.device = dev;
    p.n_threads = 8;
    qf_error err = {0};
    qf_context *c = qf_context_new(m, &p, &err);
    CHECK_MSG(c, "%s", err.msg);
    if (c && qf_context_bind_artifact(c, art, &err)) {
        CHECK_MSG(0, "kv-rq binding on %s: %s", qf_device_name(dev), err.msg);
        qf_context_free(c);
        c = NULL;
    }
    return c;
}

/* n0 tokens in one batch, then n1 one-token steps: the logits of the steps */
static bool rq_steps(qf_context *c, const int32_t *toks, int n0, int n1, int nv, float *logits) {
    qf_error err = {0};
    bool ok = qf_decode(c, toks, n0, 0, NULL, n0, &err) == QF_OK;
    for (int i = 0; ok && i < n1; i++)
        ok = qf_decode(c, toks + n0 + i, 1, n0 + i, logits + (size_t)i * nv, 0, &err) == QF_OK;
    CHECK_MSG(ok, "%s", err.msg);
    return ok;
}

/* the device decoder against the host's on c's (CPU) kv-rq cache rows of its first T tokens:
 * every value bit for bit (K as stored, V with its prediction) */
static void rq_decoder_check(qf_model *m, qf_context *c, const int32_t *toks, int T, const char *what) {
    (void)toks;
    qf_error err = {0};
    size_t rq_diff = 0, rq_n = 0;
    const qf_hparams *hp = qf_model_hparams(m);
    const int H = hp->n_head_kv, D = hp->head_dim;
    float *gk = malloc((size_t)T * H * D * 4), *gv = malloc((size_t)T * H * D * 4), *hr = malloc((size_t)T * D * 4);
    for (int il = 0; gk && gv && hr && il < hp->n_layer; il++) {
        if (qf_gpu_op_kv_rq_decode(c, il, T, gk, gv, &err)) {
            CHECK_MSG(0, "kv-rq decode op: %s", err.msg);
            break;
        }
        for (int st = 0; st < 2; st++)
            for (int h = 0; h < H; h++) {
                qf_kv_cache_read_head(&c->kv, st, il, h, T, hr);
                for (int t = 0; t < T; t++)
                    for (int d = 0; d < D; d++, rq_n++)
                        rq_diff += memcmp(hr + (size_t)t * D + d, (st ? gv : gk) + ((size_t)t * H + h) * D + d, 4) != 0;
            }
    }
    free(gk), free(gv), free(hr);
    printf("  kv-rq device decoder%s: %zu of %zu decoded K/V values differ from the host decoder's\n", what, rq_diff, rq_n);
    CHECK_MSG(rq_diff == 0 && rq_n > 0, "kv-rq device decode%s: %zu of %zu values differ", what, rq_diff, rq_n);
}

/* the device encoder against the host's: T tokens of random K and V (one K row not finite, one
 * V row zero) written into c's (CPU) kv-rq cache by the host and encoded on the GPU; every
 * stored byte of every layer compared */
static void rq_encoder_check(qf_model *m, qf_context *c, int T, const char *what) {
    qf_error err = {0};
    const qf_hparams *hp = qf_model_hparams(m);
    const int H = hp->n_head_kv, D = hp->head_dim, HD = H * D;
    float *k = malloc((size_t)T * HD * 4), *v = malloc((size_t)T * HD * 4);
    uint8_t *kb = malloc((size_t)T * H * (D * 2 + 1)), *vb = malloc((size_t)T * H * (D * 2 + 1));
    size_t ndiff = 0, nbytes = 0;
    for (int il = 0; k && v && kb && vb && il < hp->n_layer; il++) {
        for (size_t i = 0; i < (size_t)T * HD; i++) k[i] = 2.0f * frand(), v[i] = 1.5f * frand() * frand();
        k[3 * HD + 5] = NAN;
        memset(v + 5 * HD, 0, (size_t)HD * 4);
        qf_kv_cache_write(&c->kv, 0, il, 0, T, k);
        qf_kv_cache_write(&c->kv, 1, il, 0, T, v);
        if (qf_gpu_op_kv_rq_encode(c, il, T, k, v, kb, vb, &err)) {
            CHECK_MSG(0, "kv-rq encode op: %s", err.msg);
            break;
        }
        for (int st = 0; st < 2; st++) {
            const size_t n = (size_t)T * H * c->kv.rq[st]->row_bytes[il];
            const uint8_t *hb = c->kv.data[st][il], *gb = st ? vb : kb;
            for (size_t i = 0; i < n; i++) ndiff += hb[i] != gb[i];
            nbytes += n;
        }
    }
    free(k), free(v), free(kb), free(vb);
    printf("  kv-rq device encoder%s: %zu of %zu stored bytes differ from the host encoder's\n", what, ndiff, nbytes);
    CHECK_MSG(ndiff == 0 && nbytes > 0, "kv-rq device encode%s: %zu of %zu bytes differ", what, ndiff, nbytes);
}

TEST(e2e_kv_rq) {
    NEED_GPU();
    char corpus[4096];
    const char *cp = test_data("corpora/kerneldoc-demo/docs.txt");
    if (!cp) SKIP("corpora/kerneldoc-demo/docs.txt not found");
    snprintf(corpus, sizeof corpus, "%s", cp);
    size_t len = 0;
    char *text = read_text(corpus, &len);
    CHECK(text);
    struct {
        const char *model;
        double bits;
        int prerope, transform, n_ctx;
    } runs[] = {{"models/qforge-demo-11m-f16.gguf", 2.5, -1, -1, 256},        /* format 3: KLT, pre-RoPE K, V from K */
                {"models/qforge-demo-11m-f16.gguf", 4.0, 0, 0, 256},          /* format 2: Hadamard rows, K after RoPE */
                {"models/qforge-demo-11m-f16.gguf", 4.0, -1, -1, 256},        /* format 3 after RoPE (the 4-bit default) */
                {"models/qforge-demo-27m-hd128-f16.gguf", 2.5, -1, -1, 256},  /* head_dim 128 */
                {"models/qforge-demo-27m-hd128-q4_0.gguf", 2.5, -1, -1, 256}}; /* its q4_0 copy (device runs) */
    for (size_t ri = 0; text && ri < sizeof runs / sizeof runs[0]; ri++) {
        char model[4096], out[4096];
        const char *mp = model_path(runs[ri].model);
        if (!mp) {
            printf("  kv-rq: %s not found, skipped\n", runs[ri].model);
            continue;
        }
        snprintf(model, sizeof model, "%s", mp);
        snprintf(out, sizeof out, "%s/rq%zu.qfa", test_tmpdir(), ri);
        double t0 = qf_now_sec();
        if (!rq_calibrate(model, corpus, runs[ri].bits, runs[ri].prerope, runs[ri].transform, runs[ri].n_ctx, out)) continue;
        double t_cal = qf_now_sec() - t0;
        qf_error err = {0};
        qf_model *m = qf_model_load(model, &err);
        CHECK_MSG(m, "%s", err.msg);
        qf_artifact art = {0};
        if (!m || qf_artifact_load(out, qf_model_sha256(m), NULL, &art, &err)) {
            CHECK_MSG(0, "%s: %s", out, err.msg);
            qf_model_free(m);
            continue;
        }
        const int N = runs[ri].n_ctx, nv = qf_model_hparams(m)->n_vocab;
        /* PPL over 4 chunks of the certified context */
        double ppl[4] = {NAN, NAN, NAN, NAN}, tps[4] = {0, 0, 0, 0};
        for (int d = 0; d < 4; d++) { /* CPU, GPU (flash prefill), GPU with f32 GEMMs, GPU with the warp kernel */
            rq_gemm_f32 = d == 2, rq_attn_warp = d == 3;
            qf_context *c = rq_context(m, d ? QF_DEVICE_CUDA : QF_DEVICE_CPU, &art, N);
            rq_gemm_f32 = rq_attn_warp = false;
            if (!c) continue;
            qf_ppl_params pp = qf_ppl_default_params();
            pp.n_ctx = N;
            pp.n_chunks = 4;
            qf_ppl_result r;
            if (qf_perplexity_text(c, text, len, &pp, &r, &err) == QF_OK) ppl[d] = r.ppl, tps[d] = r.tokens_per_sec;
            else CHECK_MSG(0, "ppl: %s", err.msg);
            qf_context_free(c);
        }
        const double rel = fabs(ppl[1] / ppl[0] - 1);
        /* decode: 40 tokens, then 24 one-token steps; and the same 64 tokens in one batch on the GPU */
        const int n0 = 40, n1 = 24;
        int32_t toks[64];
        for (int i = 0; i < n0 + n1; i++) toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * (nv - 1));
        float *lc = malloc((size_t)n1 * nv * 4), *lg = malloc((size_t)n1 * nv * 4), *lb = malloc((size_t)n1 * nv * 4);
        bool ok = lc && lg && lb;
        qf_context *cc = ok ? rq_context(m, QF_DEVICE_CPU, &art, N) : NULL, *cg = ok ? rq_context(m, QF_DEVICE_CUDA, &art, N) : NULL;
        ok = cc && cg && rq_steps(cc, toks, n0, n1, nv, lc) && rq_steps(cg, toks, n0, n1, nv, lg);
        if (ok) ok = qf_decode(cg, toks, n0 + n1, 0, lb, n0, &err) == QF_OK;
        CHECK_MSG(ok, "kv-rq decode: %s", err.msg);
        if (ok) {
            rq_decoder_check(m, cc, toks, n0 + n1, "");
            /* the same with f16 layers (the learner's sensitivity runs: every layer f16 but one;
             * V's f16 rows still hold the residual of its prediction) */
            qf_payload_entry *kb = (qf_payload_entry *)qf_payload_get(&art.payload, "k_bits"),
                             *vb = (qf_payload_entry *)qf_payload_get(&art.payload, "v_bits");
            if (kb && vb && kb->type == QF_PAYLOAD_U8 && kb->count >= 2 && vb->count >= 2) {
                const uint8_t k1 = kb->bytes[1], v0 = vb->bytes[0];
                kb->bytes[1] = vb->bytes[0] = 16; /* QF_KV_RQ_BITS_F16 */
                qf_context *c16 = rq_context(m, QF_DEVICE_CPU, &art, N);
                if (c16 && qf_decode(c16, toks, n0 + n1, 0, NULL, n0 + n1, &err) == QF_OK) {
                    rq_decoder_check(m, c16, toks, n0 + n1, " (K layer 1 and V layer 0 as f16 rows)");
                    rq_encoder_check(m, c16, n0 + n1, " (K layer 1 and V layer 0 as f16 rows)");
                }
                if (c16) qf_context_free(c16);
                kb->bytes[1] = k1, vb->bytes[0] = v0;
            }
        }
        if (ok) {
            const size_t nl = (size_t)n1 * nv;
            double e = nmse(lg, lc, nl), eb = nmse(lg, lb, nl);
            int agree = 0;
            for (int t = 0; t < n1; t++) agree += argmax(lg + (size_t)t * nv, nv) == argmax(lc + (size_t)t * nv, nv);
            const char *fmt = qf_payload_get(&art.payload, "rotation") ? qf_payload_get(&art.payload, "rotation")->str : "?";
            int64_t S = 0, R = 0, pr = 0;
            qf_payload_get_int(&art.payload, "n_sink", &S), qf_payload_get_int(&art.payload, "n_window", &R);
            qf_payload_get_int(&art.payload, "k_prerope", &pr);
            printf("  kv-rq %s %.1f bits (%s, pre-RoPE K %lld, S%lld R%lld; calibrated in %.1f s): PPL CPU %.5f (%.0f tok/s) "
                   "GPU %.5f (%.0f tok/s), rel diff %.2e (GPU with f32 GEMMs: %.5f, %.2e; with the warp kernel in "
                   "prefill: %.5f (%.0f tok/s), %.2e); decode steps: nmse %.3g against the CPU's steps, %.3g against "
                   "the GPU's batched pass, top-1 %d/%d\n",
                   runs[ri].model + 7, runs[ri].bits, fmt, (long long)pr, (long long)S, (long long)R, t_cal, ppl[0],
                   tps[0], ppl[1], tps[1], rel, ppl[2], fabs(ppl[2] / ppl[0] - 1), ppl[3], tps[3],
                   fabs(ppl[3] / ppl[0] - 1), e, eb, agree, n1);
            /* the decoder is exact (above); what differs is K/V itself: the default route's f16
             * GEMM inputs move some coordinates across 1- and 2-bit decision boundaries
             * (docs/gpu.md "kv-rq on the GPU": 6.3e-4 .. 2.6e-3 measured) */
            CHECK_MSG(rel < 5e-3 && fabs(ppl[2] / ppl[0] - 1) < 5e-3 && fabs(ppl[3] / ppl[0] - 1) < 5e-3,
                      "kv-rq PPL: CPU %f vs GPU %f / %f (f32 GEMMs) / %f (warp)", ppl[0], ppl[1], ppl[2], ppl[3]);
            CHECK_MSG(e < 1e-2 && eb < 1e-2, "kv-rq decode nmse %g / %g", e, eb);
            CHECK(agree >= n1 - 3);
        }
        if (ok) rq_encoder_check(m, cc, n0 + n1, ""); /* last: it overwrites cc's cache */
        if (cc) qf_context_free(cc);
        if (cg) qf_context_free(cg);
        free(lc), free(lg), free(lb);
        /* the same calibration certified on the GPU (--device cuda: capture with the pre-RoPE and
         * query taps, reference, sensitivity runs and candidates there, f32 GEMMs): the same
         * verdict, the reference PPL to 1e-6 and the candidate's within the devices' drift */
        char outg[4096];
        snprintf(outg, sizeof outg, "%s/rq%zu_gpu.qfa", test_tmpdir(), ri);
        t0 = qf_now_sec();
        qf_artifact ag = {0};
        if (rq_calibrate_on(model, corpus, runs[ri].bits, runs[ri].prerope, runs[ri].transform, runs[ri].n_ctx, outg,
                            QF_DEVICE_CUDA) &&
            qf_artifact_load(outg, qf_model_sha256(m), NULL, &ag, &err) == QF_OK) {
            const double t_gpu = qf_now_sec() - t0;
            const qf_payload_entry *dv = qf_payload_get(&ag.cert.config, "certify_device");
            const char *kb[2] = {qf_payload_get_string(&art.cert.config, "k_bits"),
                                 qf_payload_get_string(&ag.cert.config, "k_bits")};
            printf("  kv-rq calibration on the GPU: %.1f s (CPU %.1f s), certify_device %s; ref PPL %.9g / %.9g (CPU), "
                   "candidate %.6f / %.6f, KLD %.5f / %.5f, passed %d / %d, K bits %s / %s\n",
                   t_gpu, t_cal, dv && dv->type == QF_PAYLOAD_STRING ? dv->str : "?", ag.cert.ref_ppl, art.cert.ref_ppl,
                   ag.cert.cand_ppl, art.cert.cand_ppl, ag.cert.kld_mean, art.cert.kld_mean, ag.cert.passed,
                   art.cert.passed, kb[1] ? kb[1] : "?", kb[0] ? kb[0] : "?");
            CHECK(dv && dv->type == QF_PAYLOAD_STRING && !strcmp(dv->str, "cuda"));
            CHECK_MSG(fabs(ag.cert.ref_ppl / art.cert.ref_ppl - 1) < 1e-5, "reference PPL GPU %.9g vs CPU %.9g",
                      ag.cert.ref_ppl, art.cert.ref_ppl);
            CHECK(ag.cert.passed == art.cert.passed);
            /* in the canonical arithmetic (both certificates say so) the numbers, the allocation and
             * the learned payload are the same bits */
            const char *ac = qf_payload_get_string(&art.cert.config, "arith"), *ag_ = qf_payload_get_string(&ag.cert.config, "arith");
            const bool canon = ac && ag_ && !strcmp(ac, "canonical") && !strcmp(ag_, "canonical");
            const bool same = ag.cert.ref_ppl == art.cert.ref_ppl && ag.cert.cand_ppl == art.cert.cand_ppl &&
                              ag.cert.kld_mean == art.cert.kld_mean && ag.cert.kld_p99 == art.cert.kld_p99 &&
                              ag.cert.top1_agreement == art.cert.top1_agreement &&
                              !memcmp(ag.cert.payload_sha256, art.cert.payload_sha256, 32);
            printf("  kv-rq certificate CPU vs GPU: arith %s / %s; numbers and payload %s\n", ac ? ac : "?", ag_ ? ag_ : "?",
                   same ? "identical" : "differ");
            CHECK(canon && same);
        }
        qf_artifact_free(&ag);
        qf_artifact_free(&art);
        qf_model_free(m);
    }
    free(text);
}

/* the canonical forward pass with a kv-rq artifact bound (its rows, exact sinks and window, V
 * predicted from pre-RoPE K): the GPU's logits and every tapped value equal the CPU's */
TEST(e2e_canonical_kv_rq) {
    NEED_GPU();
    char model[4096], corpus[4096];
    const char *p = model_path("models/qforge-demo-11m-f16.gguf");
    if (!p) SKIP("demo model not found");
    snprintf(model, sizeof model, "%s", p);
    if (!(p = test_data("corpora/kerneldoc-demo/docs.txt"))) SKIP("corpora/kerneldoc-demo/docs.txt not found");
    snprintf(corpus, sizeof corpus, "%s", p);
    qf_error err = {0};
    qf_model *m = qf_model_load(model, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!m) return;
    /* format 3, pre-RoPE K + V predicted; format 2 (the Hadamard rows); format 3 after RoPE */
    const struct { double bits; int prerope, transform; } runs[] = {{2.5, -1, -1}, {4.0, -1, 0}, {4.0, -1, -1}};
    for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
        char out[4096];
        snprintf(out, sizeof out, "%s/canon_rq%zu.qfa", test_tmpdir(), ri);
        qf_artifact art = {0};
        if (!rq_calibrate(model, corpus, runs[ri].bits, runs[ri].prerope, runs[ri].transform, 128, out) ||
            qf_artifact_load(out, qf_model_sha256(m), NULL, &art, &err) != QF_OK) {
            CHECK_MSG(0, "kv-rq artifact %.1f bits: %s", runs[ri].bits, err.msg);
            continue;
        }
        char label[64];
        snprintf(label, sizeof label, "kv-rq %.1f bits%s", runs[ri].bits, runs[ri].transform == 0 ? " hadamard" : "");
        canon_model(m, label, QF_KV_F16, QF_KV_ROT_NONE, &art, 128, 100, 6);
        qf_artifact_free(&art);
    }
    qf_model_free(m);
}

/* ---- the AWQ learner on the GPU (cuda_awq.cu against learn_awq.c) ---- */

/* A weight with AWQ's shape of problem: rows of N(0, 0.02)-like values with a few outlier
 * channels, positive scales s, a diagonal importance and SPD block covariances (A A^T / 32 plus
 * a floor, one block degenerate: all zero weights) */
static void awq_problem(int64_t R, int64_t D, float *W, float *s, float *imp, float *cov) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < D; c++) W[r * D + c] = frand() * 0.03f * (c % 37 == 0 ? 8.0f : 1.0f);
    for (int64_t c = 0; c < 32; c++) W[3 * D + 32 + c] = 0; /* row 3, block 1: zeros */
    for (int64_t c = 0; c < D; c++) s[c] = 0.25f + 2.0f * (frand() + 1.0f), imp[c] = 0.01f + (frand() + 1.0f);
    float a[32 * 32];
    for (int64_t b = 0; b < D / 32; b++) {
        for (int i = 0; i < 1024; i++) a[i] = frand();
        float *h = cov + b * 1024;
        for (int i = 0; i < 32; i++)
            for (int j = 0; j < 32; j++) {
                float v = 0;
                for (int k = 0; k < 32; k++) v += a[i * 32 + k] * a[j * 32 + k];
                h[i * 32 + j] = v / 32 + (i == j ? 0.05f : 0);
            }
    }
}

TEST(op_awq_quant) {
    NEED_GPU();
    const int64_t R = 150, D = 512, nb = D / 32;
    float *W = malloc((size_t)(R * D) * 4), *s = malloc((size_t)D * 4), *imp = malloc((size_t)D * 4);
    float *cov = malloc((size_t)D * 32 * 4);
    block_q4_0 *qc = malloc((size_t)(R * nb) * sizeof(block_q4_0)), *qg = malloc((size_t)(R * nb) * sizeof(block_q4_0));
    float *rc = malloc((size_t)(R * nb) * 4), *rg = malloc((size_t)(R * nb) * 4);
    float *dc = malloc((size_t)(R * D) * 4), *dg = malloc((size_t)(R * D) * 4);
    awq_problem(R, D, W, s, imp, cov);
    static const char *names[3] = {"rtn", "diag search", "cov search"};
    for (int quant = 0; quant < 3; quant++)
        for (int scaled = 0; scaled < 2; scaled++) {
            qf_error err = {0};
            const float *sp = scaled ? s : NULL;
            CHECK_EQ_INT(qf_awq_quant_rows(W, R, D, sp, quant, imp, cov, qc, rc, dc), QF_OK);
            qf_status st = qf_cuda_awq_quantize(W, R, D, sp, quant, imp, cov, qg, rg, dg, &err);
            CHECK_MSG(st == QF_OK, "%s", err.msg);
            if (st) continue;
            int64_t bdiff = 0, rdiff = 0, ddiff = 0, searched = 0;
            for (int64_t i = 0; i < R * nb; i++) {
                bdiff += memcmp(&qc[i], &qg[i], sizeof qc[i]) != 0;
                rdiff += memcmp(&rc[i], &rg[i], 4) != 0;
                searched += rc[i] != 1.0f;
            }
            for (int64_t i = 0; i < R * D; i++) ddiff += memcmp(&dc[i], &dg[i], 4) != 0;
            printf("  %-11s %s: %lld of %lld blocks differ, %lld ratios, %lld dequantized values (%lld blocks "
                   "moved off RTN)\n",
                   names[quant], scaled ? "x s" : "   ", (long long)bdiff, (long long)(R * nb), (long long)rdiff,
                   (long long)ddiff, (long long)searched);
            CHECK_EQ_INT(bdiff, 0);
            CHECK_EQ_INT(rdiff, 0);
            CHECK_EQ_INT(ddiff, 0);
            if (quant) CHECK(searched > 0); /* the search did something to compare */
        }
    /* the group MSE: the GPU's against the CPU's quantized weight in double on the host */
    const int64_t n = 64;
    float *X = malloc((size_t)(n * D) * 4);
    for (int64_t i = 0; i < n * D; i++) X[i] = frand() * (i % 53 == 0 ? 6.0f : 1.0f);
    qf_cuda_awq *g = NULL;
    qf_error err = {0};
    qf_status st = qf_cuda_awq_group_new(X, n, D, W, R, &g, &err);
    CHECK_MSG(st == QF_OK, "%s", err.msg);
    for (int quant = 0; quant < 3 && !st; quant++) {
        double mg = -1, e = 0;
        st = qf_cuda_awq_group_mse(g, s, quant, imp, cov, &mg, &err);
        CHECK_MSG(st == QF_OK, "%s", err.msg);
        CHECK_EQ_INT(qf_awq_quant_rows(W, R, D, s, quant, imp, cov, NULL, NULL, dc), QF_OK);
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < R; r++) {
                double y = 0, yq = 0;
                for (int64_t c = 0; c < D; c++)
                    y += (double)X[i * D + c] * W[r * D + c], yq += (double)X[i * D + c] * dc[r * D + c];
                e += (y - yq) * (y - yq);
            }
        e /= (double)(n * R);
        printf("  group mse, %-11s: GPU %.9e, CPU weights in f64 %.9e (rel. %.1e)\n", names[quant], mg, e,
               fabs(mg / e - 1));
        CHECK(fabs(mg / e - 1) < 1e-4);
    }
    /* bad shapes are refused, not run */
    CHECK_EQ_INT(qf_cuda_awq_quantize(W, R, 33, NULL, 0, NULL, NULL, qg, NULL, NULL, &err), QF_ERR_ARG);
    CHECK_EQ_INT(qf_cuda_awq_quantize(W, R, D, NULL, 2, imp, NULL, qg, NULL, NULL, &err), QF_ERR_ARG);
    qf_cuda_awq_group_free(g);
    free(X), free(W), free(s), free(imp), free(cov), free(qc), free(qg), free(rc), free(rg), free(dc), free(dg);
}

/* kv-rq's learner with its dense steps on the GPU (the V predictor's Gram sums, triangular
 * solves and residual; V minus its prediction for the codebooks and the KLT fit) against the
 * same learner on the CPU: every learned array bit for bit. 3 KV heads of 32 and 1000 tokens
 * put edges into every tile of the device kernels. */
static bool same_bytes(const void *a, const void *b, size_t n, const char *what) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += ((const uint8_t *)a)[i] != ((const uint8_t *)b)[i];
    if (d) printf("  %s: %zu of %zu bytes differ\n", what, d, n);
    return d == 0;
}
TEST(op_rq_learn) {
    NEED_GPU();
    enum { L = 2, H = 3, D = 32, N = 1000, HD = H * D };
    float *k[L], *v[L];
    for (int l = 0; l < L; l++) { /* a few strong directions, V = 2 K + its own data */
        k[l] = malloc(sizeof(float) * N * HD), v[l] = malloc(sizeof(float) * N * HD);
        for (int r = 0; r < N; r++) {
            float c0 = 4 * frand(), c1 = 2 * frand();
            for (int i = 0; i < HD; i++) {
                k[l][r * HD + i] = c0 * (float)((i * 7 + l) % 5 - 2) + c1 * (float)(i % 3) + 0.3f * frand();
                v[l][r * HD + i] = 2.0f * k[l][r * HD + i] + 0.5f * frand() + 0.1f * (float)(i % 4);
            }
        }
    }
    const float *kk[L] = {k[0], k[1]}, *vv[L] = {v[0], v[1]};
    int64_t nk[L] = {N * H, N * H}, nv[L] = {N * H, N * H};
    qf_kv_capture_view cv = {.n_layer = L, .n_kv_head = H, .head_dim = D, .k = kk, .v = vv, .n_k = nk, .n_v = nv};
    float *kw = malloc(sizeof(float) * L * HD), *vg = malloc(sizeof(float) * L * HD * D);
    for (int i = 0; i < L * HD; i++) kw[i] = 0.5f + (float)(i % 7);
    for (int b = 0; b < L * H; b++)
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++) vg[((size_t)b * D + i) * D + j] = (i == j ? 3.0f : 0.0f) + 0.1f * (float)((i + j) % 3);
    qf_kv_rq_fit f[2];
    memset(f, 0, sizeof f);
    double sec[2] = {0, 0};
    for (int g = 0; g < 2; g++) {
        qf_kv_rq_learn_params lp;
        qf_kv_rq_learn_params_default(&lp);
        lp.lloyd_iters = 8, lp.v_pred = true, lp.n_threads = 2, lp.gpu = g;
        qf_error e = {0};
        double t0 = qf_now_sec();
        qf_status st = qf_kv_rq_learn(&cv, &lp, &f[g], &e);
        CHECK_MSG(st == QF_OK, "%s", e.msg);
        if (!st) st = qf_kv_rq_learn_klt(&cv, kw, vg, &lp, &f[g], &e);
        CHECK_MSG(st == QF_OK, "%s", e.msg);
        sec[g] = qf_now_sec() - t0;
    }
    printf("  learn + klt: CPU %.3f s, GPU steps %.3f s; predictor residual / V variance %.4f %.4f\n", sec[0], sec[1],
           f[0].v_pred_ratio ? f[0].v_pred_ratio[0] : -1, f[0].v_pred_ratio ? f[0].v_pred_ratio[1] : -1);
    if (f[0].v_pred && f[1].v_pred && f[0].klt && f[1].klt) {
        const size_t lhd = (size_t)L * HD, nw = QF_KV_RQ_N_WIDTHS;
        CHECK(f[0].v_pred_ratio[0] < 0.9); /* the predictor is used: its residual feeds everything below */
        CHECK(same_bytes(f[0].v_pred, f[1].v_pred, sizeof(float) * L * HD * HD, "v_pred"));
        CHECK(same_bytes(f[0].v_pred_ratio, f[1].v_pred_ratio, sizeof(double) * L, "v_pred_ratio"));
        for (int s = 0; s < 2; s++) {
            CHECK(same_bytes(f[0].mean[s], f[1].mean[s], sizeof(float) * lhd, "mean"));
            CHECK(same_bytes(f[0].cs[s], f[1].cs[s], sizeof(float) * lhd, "cs"));
            CHECK(same_bytes(f[0].rel_mse[s], f[1].rel_mse[s], sizeof(double) * L * nw, "rel_mse"));
            for (size_t w = 0; w < nw; w++)
                CHECK(same_bytes(f[0].levels[s][w], f[1].levels[s][w], sizeof(float) * L * H * 64, "levels"));
            const qf_kv_rq_klt_fit *a = f[0].klt, *b = f[1].klt;
            CHECK(same_bytes(a->enc[s], b->enc[s], sizeof(float) * lhd * D, "klt enc"));
            CHECK(same_bytes(a->dec[s], b->dec[s], sizeof(float) * lhd * D, "klt dec"));
            CHECK(same_bytes(a->sigma[s], b->sigma[s], sizeof(float) * lhd, "klt sigma"));
            CHECK(same_bytes(a->levels[s], b->levels[s], sizeof(float) * lhd * nw * 64, "klt levels"));
            CHECK(same_bytes(a->width[s], b->width[s], QF_KV_RQ_KLT_N_RATES * lhd, "klt width"));
            CHECK(same_bytes(a->eig[s], b->eig[s], sizeof(double) * lhd, "klt eig"));
            CHECK(same_bytes(a->rel8[s], b->rel8[s], sizeof(double) * L * QF_KV_RQ_KLT_N_RATES, "klt rel8"));
            CHECK(same_bytes(a->had_rel_mse[s], b->had_rel_mse[s], sizeof(double) * L * nw, "klt had_rel_mse"));
        }
    } else
        CHECK(0);
    /* the entries refuse what they cannot run */
    qf_error e = {0};
    double A[4], B[4];
    CHECK_EQ_INT(qf_cuda_learn_gram_f64(NULL, k[0], 2, 2, 2, A, B, A, B, &e), QF_ERR_ARG);
    CHECK_EQ_INT(qf_cuda_learn_chol_sub_f64(A, 0, B, 1, &e), QF_ERR_ARG);
    CHECK_EQ_INT(qf_cuda_learn_rows_minus_f64(v[0], k[0], 4, 0, HD, kw, NULL, k[1], &e), QF_ERR_ARG);
    CHECK_EQ_INT(qf_cuda_learn_resid_f64(v[0], k[0], 4, HD, HD, A, NULL, A, &e), QF_ERR_ARG);
    printf("  refusal: %s\n", e.msg);
    /* the KLT measurement: NULL, a head_dim that is no power of two, no rows */
    uint8_t wd[6 * D] = {0};
    qf_cuda_klt_measure km = {.n_head = 1, .head_dim = D, .n_widths = 6, .n_rows = 4, .x = k[0], .mean = kw, .cs = kw,
                              .enc = vg, .dec = vg, .sigma = kw, .width = wd, .klevels = vg, .hlevels = vg, .den = A,
                              .err3 = NULL, .errh = B};
    CHECK_EQ_INT(qf_cuda_learn_klt_measure(NULL, &e), QF_ERR_ARG);
    CHECK_EQ_INT(qf_cuda_learn_klt_measure(&km, &e), QF_ERR_ARG);
    km.err3 = B, km.head_dim = 48;
    CHECK_EQ_INT(qf_cuda_learn_klt_measure(&km, &e), QF_ERR_ARG);
    km.head_dim = D, km.n_rows = 0;
    CHECK_EQ_INT(qf_cuda_learn_klt_measure(&km, &e), QF_ERR_ARG);
    printf("  refusal: %s\n", e.msg);
    for (int g = 0; g < 2; g++) qf_kv_rq_fit_free(&f[g]);
    for (int l = 0; l < L; l++) free(k[l]), free(v[l]);
    free(kw), free(vg);
}

/* qf_awq_run on the demo model, CPU and GPU, same tokens: the alphas and the Q4_0 blocks they
 * give. The GPU's capture runs f32 GEMMs, so its activations (and the covariances the search
 * weighs) differ from the CPU's in their last bits: a few blocks may round the other way, an
 * alpha may move where two candidates tie. */
TEST(e2e_awq) {
    NEED_GPU();
    const char *mp = model_path("models/qforge-demo-11m-f16.gguf");
    const char *cp = test_data("corpora/kerneldoc-demo/docs.txt");
    if (!mp || !cp) SKIP("demo model or corpora/kerneldoc-demo/docs.txt not found");
    size_t len = 0;
    char *text = NULL;
    qf_error err = {0};
    qf_model *m = qf_read_file(cp, &text, &len, &err) == QF_OK ? qf_model_load(mp, &err) : NULL;
    CHECK(m);
    if (!m) {
        free(text);
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(qf_tokenize(qf_model_tokenizer(m), text, len, true, false, &ids, &n, &err) == QF_OK);
    char out[2][4096];
    qf_awq_report rep[2];
    memset(rep, 0, sizeof rep);
    for (int d = 0; d < 2; d++) {
        snprintf(out[d], sizeof out[d], "%s/awq_%s.gguf", test_tmpdir(), d ? "gpu" : "cpu");
        qf_awq_params p = qf_awq_default_params();
        p.max_tokens = 4096;
        p.n_ctx = 256;
        p.n_threads = 2;
        p.device = d ? QF_DEVICE_CUDA : QF_DEVICE_CPU;
        qf_status st = qf_awq_run(m, ids, (int64_t)n, &p, out[d], &rep[d], &err);
        CHECK_MSG(st == QF_OK, "%s", err.msg);
        if (st) goto done;
        printf("  %s: %.2f s (capture %.2f, search %.2f, block quantizer %.2f, write %.2f)\n", d ? "GPU" : "CPU",
               rep[d].seconds, rep[d].seconds_capture, rep[d].seconds_search, rep[d].seconds_quant,
               rep[d].seconds_write);
    }
    CHECK(!rep[0].on_gpu && rep[1].on_gpu);
    {
        int L = rep[0].n_layer, na = 0, same = 0;
        for (int i = 0; i < L * QF_AWQ_GROUP_COUNT; i++)
            if (rep[0].alpha[i] >= 0) na++, same += rep[0].alpha[i] == rep[1].alpha[i];
        qf_model *a = qf_model_load(out[0], &err), *b = qf_model_load(out[1], &err);
        CHECK(a && b);
        int64_t nblk = 0, ndiff = 0;
        for (int l = 0; a && b && l < L; l++) {
            const qf_layer_weights *la = qf_model_layer(a, l), *lb = qf_model_layer(b, l);
            const qf_weight *wa[7] = {&la->wq, &la->wk, &la->wv, &la->wo, &la->w_gate, &la->w_up, &la->w_down};
            const qf_weight *wb[7] = {&lb->wq, &lb->wk, &lb->wv, &lb->wo, &lb->w_gate, &lb->w_up, &lb->w_down};
            for (int k = 0; k < 7; k++) {
                CHECK_EQ_INT(wa[k]->type, QF_TYPE_Q4_0);
                if (wa[k]->type != QF_TYPE_Q4_0 || wb[k]->type != QF_TYPE_Q4_0) continue;
                const block_q4_0 *x = wa[k]->data, *y = wb[k]->data;
                int64_t nbk = wa[k]->ne1 * (wa[k]->ne0 / 32);
                for (int64_t i = 0; i < nbk; i++) ndiff += memcmp(&x[i], &y[i], sizeof x[i]) != 0;
                nblk += nbk;
            }
        }
        printf("  alphas: %d of %d groups equal; Q4_0 blocks: %lld of %lld differ (%.3f%%)\n", same, na,
               (long long)ndiff, (long long)nblk, nblk ? 100.0 * (double)ndiff / (double)nblk : 0.0);
        /* the capture runs in the canonical arithmetic on both devices (the same activations)
         * and the block quantizer is the CPU's bit for bit: the same model (H200: 24 of 24 alphas,
         * 0 of 294 912 blocks differ; 265 blocks differed before the canonical capture) */
        CHECK(na > 0 && same == na);
        CHECK(nblk > 0 && ndiff == 0);
        qf_model_free(a), qf_model_free(b);
    }
done:
    for (int d = 0; d < 2; d++) qf_awq_report_free(&rep[d]), unlink(out[d]);
    free(ids), free(text);
    qf_model_free(m);
}

int main(void) {
    RUN(device_selection);
    RUN(op_dequant);
    RUN(op_matmul);
    RUN(op_matmul_tall);
    RUN(op_matvec_gu);
    RUN(op_rmsnorm_silu);
    RUN(op_rmsnorm_act);
    RUN(op_rope);
    RUN(op_kv_cache);
    RUN(op_kv_rot);
    RUN(op_kv_int8_dict);
    RUN(op_kv_dict_encode);
    RUN(op_attention);
    RUN(e2e_logits_and_taps);
    RUN(e2e_families);
    RUN(e2e_decode_graph);
    RUN(e2e_decode_graph_one);
    RUN(e2e_decode_norm_fold);
    RUN(op_topk);
    RUN(e2e_decode_topk);
    RUN(e2e_generate_device_sampler);
    RUN(e2e_decode_graph_int8);
    RUN(e2e_decode_int8_long);
    RUN(e2e_perplexity);
    RUN(e2e_kv_rot);
    RUN(e2e_artifacts);
    RUN(op_canon_matmul);
    RUN(e2e_canonical);
    RUN(e2e_certificate);
    RUN(e2e_certificate_dict);
    RUN(e2e_kv_rq);
    RUN(e2e_canonical_kv_rq);
    RUN(op_awq_quant);
    RUN(op_rq_learn);
    RUN(e2e_awq);
    return test_summary();
}
