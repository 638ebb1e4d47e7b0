/* test_quant.c: the block-format kernels. The scalar oracle is checked against plain float
 * math (and the quantized demo models against their f16 original, which catches a wrong
 * layout); every fast kernel is checked against the oracle on random blocks and on real
 * tensors: dequantize and quantize bit-exact, vec_dot within 1e-5 of sum|w*x|. */
#include <stdint.h>

#include "kernels/gemm.h"
#include "kernels/matvec.h"
#include "kernels/quant_impl.h"
#include "qforge/gguf.h"
#include "qforge/quant.h"
#include "test.h"
#include "util/util.h"

static const qf_type WEIGHT_TYPES[] = {QF_TYPE_F32, QF_TYPE_F16, QF_TYPE_BF16, QF_TYPE_Q8_0, QF_TYPE_Q4_0,
                                       QF_TYPE_Q5_0, QF_TYPE_Q4_K, QF_TYPE_Q5_K, QF_TYPE_Q6_K};
#define N_WEIGHT_TYPES (int)(sizeof WEIGHT_TYPES / sizeof WEIGHT_TYPES[0])

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { return (uint32_t)(qf_xorshift64s(&rng) >> 32); }
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

/* Random weight row of type t: random bytes, then every scale field set to a sane half
 * (random bits could be inf/nan, which would make a float comparison meaningless). */
static void random_row(qf_type t, void *row, int64_t n) {
    size_t bytes = qf_row_bytes(t, n);
    uint8_t *p = row;
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)rnd();
    int64_t nb = n / qf_type_block_elems(t);
    switch (t) {
    case QF_TYPE_F32:
        for (int64_t i = 0; i < n; i++) ((float *)row)[i] = rndf();
        break;
    case QF_TYPE_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)row)[i] = qf_f32_to_f16(rndf());
        break;
    case QF_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)row)[i] = qf_f32_to_bf16(rndf());
        break;
    case QF_TYPE_Q4_0:
        for (int64_t i = 0; i < nb; i++) ((block_q4_0 *)row)[i].d = qf_f32_to_f16(rndf() * 0.1f);
        break;
    case QF_TYPE_Q5_0:
        for (int64_t i = 0; i < nb; i++) ((block_q5_0 *)row)[i].d = qf_f32_to_f16(rndf() * 0.1f);
        break;
    case QF_TYPE_Q8_0:
        for (int64_t i = 0; i < nb; i++) ((block_q8_0 *)row)[i].d = qf_f32_to_f16(rndf() * 0.01f);
        break;
    case QF_TYPE_Q4_K:
        for (int64_t i = 0; i < nb; i++) {
            ((block_q4_K *)row)[i].d = qf_f32_to_f16(rndf() * 0.01f);
            ((block_q4_K *)row)[i].dmin = qf_f32_to_f16(rndf() * 0.01f);
        }
        break;
    case QF_TYPE_Q5_K:
        for (int64_t i = 0; i < nb; i++) {
            ((block_q5_K *)row)[i].d = qf_f32_to_f16(rndf() * 0.01f);
            ((block_q5_K *)row)[i].dmin = qf_f32_to_f16(rndf() * 0.01f);
        }
        break;
    case QF_TYPE_Q6_K:
        for (int64_t i = 0; i < nb; i++) ((block_q6_K *)row)[i].d = qf_f32_to_f16(rndf() * 0.001f);
        break;
    default: break;
    }
}

static void dequant_fast_and_ref(qf_type t, const void *src, float *fast, float *ref, int64_t n) {
    qf_dequantize_row(t, src, fast, n);
    qf_dequantize_row_ref(t, src, ref, n);
}

/* |fast - ref| relative to sum |w_i x_i| (the dot's natural scale: a plain relative error
 * is meaningless when the terms cancel). Also checks the oracle against double math on the
 * dequantized rows, which validates the integer formulation itself. */
static void check_dot(qf_type t, const void *w, const void *x, int64_t n, const char *what) {
    qf_type xt = qf_vec_dot_type(t);
    float *wf = malloc((size_t)n * sizeof(float)), *xf = malloc((size_t)n * sizeof(float));
    qf_dequantize_row_ref(t, w, wf, n);
    qf_dequantize_row_ref(xt, x, xf, n);
    double exact = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)wf[i] * xf[i];
        scale += fabs((double)wf[i] * xf[i]);
    }
    if (scale == 0.0) scale = 1e-30;
    float ref = qf_vec_dot_ref(t, n, w, x);
    float fast = qf_vec_dot(t, n, w, x);
    CHECK_MSG(fabs(ref - exact) / scale < 1e-5, "%s %s n=%lld: oracle %.9g vs exact %.9g (scale %g)",
              what, qf_type_name(t), (long long)n, ref, exact, scale);
    CHECK_MSG(fabs(fast - ref) / scale < 1e-5, "%s %s n=%lld: fast %.9g vs oracle %.9g (scale %g)",
              what, qf_type_name(t), (long long)n, fast, ref, scale);
    free(wf);
    free(xf);
}

TEST(type_table) {
    CHECK(strcmp(qf_type_name(QF_TYPE_Q4_K), "q4_K") == 0);
    CHECK(strcmp(qf_type_name(QF_TYPE_BF16), "bf16") == 0);
    CHECK(qf_type_name((qf_type)4) == NULL); /* removed from ggml */
    CHECK(qf_type_name((qf_type)-1) == NULL);
    CHECK(qf_type_name(QF_TYPE_COUNT) == NULL);
    qf_type t;
    CHECK(qf_type_from_name("Q8_0", &t) && t == QF_TYPE_Q8_0);
    CHECK(qf_type_from_name("q4_k", &t) && t == QF_TYPE_Q4_K);
    CHECK(qf_type_from_name("F16", &t) && t == QF_TYPE_F16);
    CHECK(!qf_type_from_name("q9_0", &t));
    CHECK(!qf_type_from_name(NULL, &t));
    for (int i = 0; i < N_WEIGHT_TYPES; i++) CHECK(qf_type_is_supported(WEIGHT_TYPES[i]));
    CHECK(qf_type_is_known(QF_TYPE_Q2_K) && !qf_type_is_supported(QF_TYPE_Q2_K));
    CHECK(qf_type_is_known((qf_type)23) && !qf_type_is_supported((qf_type)23)); /* iq4_xs */
    CHECK(!qf_type_is_known((qf_type)31));
    CHECK_EQ_INT(qf_type_block_elems(QF_TYPE_Q6_K), 256);
    CHECK_EQ_INT(qf_type_block_bytes(QF_TYPE_Q6_K), 210);
    CHECK_EQ_INT(qf_type_block_bytes(QF_TYPE_Q8_K), 292);
    CHECK_EQ_INT(qf_row_bytes(QF_TYPE_Q4_0, 64), 36);
    CHECK_EQ_INT(qf_row_bytes(QF_TYPE_Q4_0, 48), 0);
    CHECK_EQ_INT(qf_row_bytes(QF_TYPE_F16, 3), 6);
    CHECK_EQ_INT(qf_row_bytes((qf_type)99, 32), 0);
    CHECK(qf_vec_dot_type(QF_TYPE_Q5_0) == QF_TYPE_Q8_0);
    CHECK(qf_vec_dot_type(QF_TYPE_Q6_K) == QF_TYPE_Q8_K);
    CHECK(qf_vec_dot_type(QF_TYPE_BF16) == QF_TYPE_BF16);
}

TEST(bad_input_is_refused) {
    float f[64] = {0};
    uint8_t b[512];
    CHECK(!qf_quantize_row(QF_TYPE_Q8_0, f, b, 48));
    CHECK(!qf_quantize_row_ref(QF_TYPE_Q8_0, f, b, 48));
    CHECK(!qf_quantize_row(QF_TYPE_Q4_K, f, b, 256)); /* no quantizer for it */
    CHECK(!qf_quantize_row((qf_type)99, f, b, 32));
    CHECK(qf_vec_dot(QF_TYPE_Q8_0, 48, b, b) == 0.0f);
    CHECK(qf_vec_dot((qf_type)99, 32, b, b) == 0.0f);
    qf_dequantize_row((qf_type)99, b, f, 32); /* no-op, no crash */
    qf_dequantize_row(QF_TYPE_Q2_K, b, f, 32);
}

/* The oracle on hand-computable blocks. */
TEST(oracle_known_values) {
    /* Q4_0: x = j - 16: largest magnitude -16 gives d = 2 and q = x/2 + 8 clamped to 15 */
    float x[32], y[32];
    block_q4_0 q4;
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    CHECK(qf_quantize_row_ref(QF_TYPE_Q4_0, x, &q4, 32));
    CHECK(qf_f16_to_f32(q4.d) == 2.0f);
    CHECK_EQ_INT(q4.qs[0] & 0xF, 0);
    CHECK_EQ_INT(q4.qs[15] >> 4, 15); /* x = 15 -> 16 clamps to 15 */
    qf_dequantize_row_ref(QF_TYPE_Q4_0, &q4, y, 32);
    CHECK(y[0] == -16.0f && y[1] == -14.0f && y[31] == 14.0f);
    /* Q8_0 rounds half away from zero: amax 127 gives d = id = 1 */
    for (int j = 0; j < 32; j++) x[j] = 0.0f;
    x[0] = 127.0f;
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = 0.5f;
    block_q8_0 q8;
    CHECK(qf_quantize_row_ref(QF_TYPE_Q8_0, x, &q8, 32));
    CHECK(q8.qs[0] == 127 && q8.qs[1] == 3 && q8.qs[2] == -3 && q8.qs[3] == 1);
    /* Q8_K rounds half to even and keeps per-16 sums */
    float xk[256] = {0};
    xk[5] = 127.0f;
    xk[6] = 2.5f;
    xk[7] = 3.5f;
    xk[20] = 0.5f;
    block_q8_K qk;
    CHECK(qf_quantize_row_ref(QF_TYPE_Q8_K, xk, &qk, 256));
    /* ggml maps the signed extreme to -127, so a positive extreme gives a negative scale */
    CHECK(qk.d == -1.0f);
    CHECK(qk.qs[5] == -127 && qk.qs[6] == -2 && qk.qs[7] == -4 && qk.qs[20] == 0);
    CHECK_EQ_INT(qk.bsums[0], -133);
    CHECK_EQ_INT(qk.bsums[1], 0);
    /* an all-zero block quantizes to zeros, bsums included */
    memset(xk, 0, sizeof xk);
    memset(&qk, 0x55, sizeof qk);
    CHECK(qf_quantize_row_ref(QF_TYPE_Q8_K, xk, &qk, 256));
    CHECK(qk.d == 0.0f && qk.qs[0] == 0 && qk.bsums[15] == 0);
}

/* Round trips through the RTN quantizers stay within half a step. */
TEST(quantize_round_trip) {
    const qf_type types[] = {QF_TYPE_Q8_0, QF_TYPE_Q4_0, QF_TYPE_Q5_0, QF_TYPE_Q8_K, QF_TYPE_F16, QF_TYPE_BF16};
    const int64_t n = 1024;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint8_t *q = malloc(qf_row_bytes(QF_TYPE_F32, n));
    for (int64_t i = 0; i < n; i++) x[i] = rndf() * 3.0f;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        qf_type t = types[k];
        CHECK(qf_quantize_row_ref(t, x, q, n));
        qf_dequantize_row_ref(t, q, y, n);
        int64_t blck = qf_type_block_elems(t) > 1 ? qf_type_block_elems(t) : 32;
        for (int64_t b = 0; b < n; b += blck) {
            float amax = 0;
            for (int64_t j = b; j < b + blck; j++) amax = fmaxf(amax, fabsf(x[j]));
            float levels = t == QF_TYPE_Q4_0 ? 8 : t == QF_TYPE_Q5_0 ? 16 : 127;
            /* half a step, plus slack for the f16-rounded scale (the quants are computed with
             * the unrounded one) and, for Q4_0/Q5_0, the clamp of the top level */
            float tol = amax / levels * (t == QF_TYPE_Q4_0 || t == QF_TYPE_Q5_0 ? 1.1f : 0.57f);
            for (int64_t j = b; j < b + blck; j++) {
                if (t == QF_TYPE_F16) tol = fabsf(x[j]) * 0x1p-11f;
                if (t == QF_TYPE_BF16) tol = fabsf(x[j]) * 0x1p-8f;
                CHECK_MSG(fabsf(x[j] - y[j]) <= tol, "%s: x[%lld]=%g -> %g", qf_type_name(t), (long long)j, x[j], y[j]);
            }
        }
    }
    free(x);
    free(y);
    free(q);
}

/* The GPU's G8 layout of Q6_K rows (quant_blocks.h): every field of every super-block read
 * through qf_q6k_at from the regrouped row is the GGUF block's, and the integer GEMMs' unpacking
 * (q6 = 2) gives the same quants and scales */
TEST(q6k_g8_layout) {
    CHECK(qf_q6k_g8_ok(2048) && qf_q6k_g8_ok(14336) && !qf_q6k_g8_ok(2304) && !qf_q6k_g8_ok(256));
    const int64_t k = 6144, rows = 3, nb = k / QK_K;
    const size_t rb = qf_row_bytes(QF_TYPE_Q6_K, k);
    uint8_t *src = malloc(rb * rows), *dst = malloc(rb * rows);
    for (int64_t r = 0; r < rows; r++) random_row(QF_TYPE_Q6_K, src + rb * r, k);
    qf_q6k_regroup(src, dst, rows, k);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const block_q6_K *x = (const block_q6_K *)(src + rb * r) + b;
            const qf_q6k_fields f = qf_q6k_at(dst + rb * r, b, 1), g = qf_q6k_at(src + rb * r, b, 0);
            CHECK(!memcmp(f.ql, x->ql, 128) && !memcmp(f.qh, x->qh, 64) && !memcmp(f.scales, x->scales, 16) &&
                  *f.d == x->d && g.ql == x->ql && g.d == &x->d);
            uint8_t q1[256], q2[256];
            int32_t s1[16], s2[16], m1[8] = {0}, m2[8] = {0};
            uint16_t d1, d2, dm1, dm2;
            qf_k_unpack(1, src + rb * r, b, q1, s1, m1, &d1, &dm1);
            qf_k_unpack(2, dst + rb * r, b, q2, s2, m2, &d2, &dm2);
            CHECK(!memcmp(q1, q2, 256) && !memcmp(s1, s2, sizeof s1) && d1 == d2 && dm1 == dm2);
        }
    free(src), free(dst);
}

TEST(force_scalar) {
    bool had = qf_quant_has_avx2();
    qf_quant_force_scalar(true);
    CHECK(!qf_quant_has_avx2());
    qf_quant_force_scalar(false);
    CHECK(qf_quant_has_avx2() == had);
    if (!had) SKIP("this CPU has no AVX2/FMA/F16C: only the oracle runs");
}

/* Fast vs oracle on random rows of several lengths (odd lengths exercise the float tails). */
TEST(random_fast_vs_oracle) {
    if (!qf_quant_has_avx2()) SKIP("no AVX2 on this CPU");
    const int64_t lens[] = {256, 512, 4096, 256 * 3};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        void *w = malloc(qf_row_bytes(QF_TYPE_F32, n) + 64);
        void *xq = malloc(qf_row_bytes(QF_TYPE_F32, n) + 64);
        void *xr = malloc(qf_row_bytes(QF_TYPE_F32, n) + 64);
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *xf = malloc(n * sizeof(float));
        for (int rep = 0; rep < 4; rep++) {
            for (int64_t i = 0; i < n; i++) xf[i] = rndf() * (rep == 3 ? 1e-3f : 2.0f);
            if (rep == 2)
                for (int64_t i = 0; i < n; i++) xf[i] = (float)(int)(xf[i] * 8) * 0.5f; /* ties */
            for (int k = 0; k < N_WEIGHT_TYPES; k++) {
                qf_type t = WEIGHT_TYPES[k], xt = qf_vec_dot_type(t);
                random_row(t, w, n);
                dequant_fast_and_ref(t, w, a, b, n);
                CHECK_MSG(memcmp(a, b, n * sizeof(float)) == 0, "dequantize %s n=%lld differs", qf_type_name(t), (long long)n);
                size_t xb = qf_row_bytes(xt, n);
                CHECK(qf_quantize_row(xt, xf, xq, n));
                CHECK(qf_quantize_row_ref(xt, xf, xr, n));
                CHECK_MSG(memcmp(xq, xr, xb) == 0, "quantize %s n=%lld differs", qf_type_name(xt), (long long)n);
                check_dot(t, w, xr, n, "random");
            }
            /* odd float lengths: the scalar tails of the F16/BF16/F32 loops */
            for (int k = 0; k < 3; k++) {
                qf_type t = WEIGHT_TYPES[k];
                int64_t m = n - 5;
                random_row(t, w, m);
                random_row(t, xr, m);
                dequant_fast_and_ref(t, w, a, b, m);
                CHECK(memcmp(a, b, m * sizeof(float)) == 0);
                CHECK(qf_quantize_row(t, xf, xq, m));
                CHECK(qf_quantize_row_ref(t, xf, w, m));
                CHECK(memcmp(xq, w, qf_row_bytes(t, m)) == 0);
                check_dot(t, xq, xr, m, "odd");
            }
        }
        /* Q8_K on a zero block and a block whose extreme is repeated with both signs */
        memset(xf, 0, n * sizeof(float));
        xf[300 % n] = -0.75f;
        xf[301 % n] = 0.75f;
        CHECK(qf_quantize_row(QF_TYPE_Q8_K, xf, xq, n));
        CHECK(qf_quantize_row_ref(QF_TYPE_Q8_K, xf, xr, n));
        CHECK(memcmp(xq, xr, qf_row_bytes(QF_TYPE_Q8_K, n)) == 0);
        free(w);
        free(xq);
        free(xr);
        free(a);
        free(b);
        free(xf);
    }
}

/* Every tensor of a supported type in a real model: fast dequantize bit-exact with the oracle
 * on up to `max_rows` rows, and vec_dot fast vs oracle vs exact on the first rows. */
static void check_model(const char *rel, int max_rows) {
    const char *path = test_data(rel);
    if (!path) {
        qf_test_skip_reason = "model not in the shared data directory";
        return;
    }
    qf_error err;
    qf_gguf *g = qf_gguf_open(path, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (!g) return;
    int seen = 0;
    for (uint64_t ti = 0; ti < qf_gguf_n_tensors(g); ti++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(g, ti);
        if (!qf_type_is_supported(t->type)) continue;
        const int64_t n = t->ne[0];
        const int64_t rows = qf_gguf_tensor_nelements(t) / n;
        const size_t rb = qf_row_bytes(t->type, n);
        CHECK(rb > 0);
        if (rb == 0) continue;
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *xf = malloc(n * sizeof(float));
        void *xq = malloc(n * sizeof(float) + 64);
        qf_type xt = qf_vec_dot_type(t->type);
        bool can_dot = qf_row_bytes(xt, n) > 0;
        for (int64_t i = 0; i < n; i++) xf[i] = rndf();
        if (can_dot) CHECK(qf_quantize_row_ref(xt, xf, xq, n));
        for (int64_t r = 0; r < rows && r < max_rows; r++) {
            const uint8_t *row = (const uint8_t *)t->data + r * rb;
            dequant_fast_and_ref(t->type, row, a, b, n);
            CHECK_MSG(memcmp(a, b, n * sizeof(float)) == 0, "%s: %.*s row %lld", rel, (int)t->name.len, t->name.ptr, (long long)r);
            if (can_dot && r < 8) check_dot(t->type, row, xq, n, rel);
        }
        seen++;
        free(a);
        free(b);
        free(xf);
        free(xq);
    }
    CHECK(seen > 0);
    qf_gguf_close(g);
}

TEST(real_q4_k_m) { check_model("models/qforge-demo-11m-q4_k_m.gguf", 64); }
TEST(real_qwen2_q4_k_m) { check_model("models/qforge-demo-qwen2-5m-q4_k_m.gguf", 64); }
TEST(real_q8_0) { check_model("models/qforge-demo-11m-q8_0.gguf", 32); }
TEST(real_f16) { check_model("models/qforge-demo-11m-f16.gguf", 32); }
/* an f32 model: stories260K, or without ../shared the random-weight fixture of its shape */
TEST(real_f32) {
    check_model(test_data("models/stories260K.gguf") ? "models/stories260K.gguf" : "models/synthetic-hd8-f32.gguf", 64);
}

/* The quantized demo models against their f16 original: a wrong block layout or scale
 * unpacking shows up as an error near 100%, the right one as the format's quantization noise. */
static void check_layout_vs_f16(const char *f16_rel, const char *q_rel) {
    /* test_data returns a static buffer: open each file before asking for the next */
    qf_error err;
    const char *pf = test_data(f16_rel);
    qf_gguf *gf = pf ? qf_gguf_open(pf, &err) : NULL;
    const char *pq = test_data(q_rel);
    if (!pf || !pq) {
        if (gf) qf_gguf_close(gf);
        qf_test_skip_reason = "demo model pair absent";
        return;
    }
    qf_gguf *gq = qf_gguf_open(pq, &err);
    CHECK(gf != NULL && gq != NULL);
    int compared = 0;
    for (uint64_t ti = 0; gf && gq && ti < qf_gguf_n_tensors(gq); ti++) {
        const qf_gguf_tensor *tq = qf_gguf_tensor_at(gq, ti);
        if (tq->type == QF_TYPE_F32 || tq->type == QF_TYPE_F16 || !qf_type_is_supported(tq->type)) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)tq->name.len, tq->name.ptr);
        const qf_gguf_tensor *tf = qf_gguf_find_tensor(gf, name);
        if (!tf || tf->type != QF_TYPE_F16 || qf_gguf_tensor_nelements(tf) != qf_gguf_tensor_nelements(tq)) continue;
        int64_t n = tq->ne[0], rows = qf_gguf_tensor_nelements(tq) / n;
        if (rows > 16) rows = 16;
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        double num = 0, den = 0;
        for (int64_t r = 0; r < rows; r++) {
            qf_dequantize_row_ref(tq->type, (const uint8_t *)tq->data + r * qf_row_bytes(tq->type, n), a, n);
            qf_dequantize_row_ref(QF_TYPE_F16, (const uint8_t *)tf->data + r * qf_row_bytes(QF_TYPE_F16, n), b, n);
            for (int64_t i = 0; i < n; i++) {
                num += (double)(a[i] - b[i]) * (a[i] - b[i]);
                den += (double)b[i] * b[i];
            }
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        /* measured: q8_0 0.6%, q6_K 1.8%, q5_0 4.3%, q4_K 7.2% */
        double lim = tq->type == QF_TYPE_Q8_0 ? 0.01 : tq->type == QF_TYPE_Q6_K ? 0.03
                   : tq->type == QF_TYPE_Q4_K ? 0.10 : 0.07;
        CHECK_MSG(rel < lim, "%s %s (%s): relative RMS error %.4f vs f16", q_rel, name, qf_type_name(tq->type), rel);
        if (getenv("QF_TEST_VERBOSE")) printf("  %s %s %s rel %.4f\n", q_rel, name, qf_type_name(tq->type), rel);
        compared++;
        free(a);
        free(b);
    }
    CHECK(compared > 0);
    if (gq) qf_gguf_close(gq);
    if (gf) qf_gguf_close(gf);
}

/* The quantized demo models against their f16 original: a wrong block layout or scale
 * unpacking shows up as an error near 100%, the right one as the format's quantization noise. */
TEST(layout_q8_0_vs_f16) { check_layout_vs_f16("models/qforge-demo-11m-f16.gguf", "models/qforge-demo-11m-q8_0.gguf"); }
TEST(layout_q4_k_m_vs_f16) { check_layout_vs_f16("models/qforge-demo-11m-f16.gguf", "models/qforge-demo-11m-q4_k_m.gguf"); }
TEST(layout_qwen2_q4_k_m_vs_f16) {
    check_layout_vs_f16("models/qforge-demo-qwen2-5m-f16.gguf", "models/qforge-demo-qwen2-5m-q4_k_m.gguf");
}

/* The integer prefill GEMM (kernels/gemm.h): the oracle against qf_vec_dot_ref with the same
 * Q8_0 activations (double precision; only float rounding may differ), and the AVX-512 VNNI
 * kernel bit-identical to the oracle, over row counts that leave partial panels and token
 * counts that leave partial groups of 8, with extreme quants (Q8_0 -128 / 127, Q4_0 0 / 15). */
static void check_gemm(qf_type wt, int64_t K, int N, int n) {
    size_t rb = qf_row_bytes(wt, K), stride = qf_gemm_act_stride(K);
    uint8_t *w = qf_malloc_aligned(rb * (size_t)N);
    float *x = qf_malloc_aligned((size_t)n * K * 4);
    uint8_t *act = qf_malloc_aligned(stride * (size_t)n);
    uint8_t *xq = qf_malloc_aligned(qf_row_bytes(QF_TYPE_Q8_0, K) * (size_t)n);
    void *tmp = qf_malloc_aligned(qf_row_bytes(QF_TYPE_Q8_0, K));
    float *yr = qf_malloc_aligned((size_t)n * N * 4), *yf = qf_malloc_aligned((size_t)n * N * 4);
    void *scratch = qf_malloc_aligned(qf_gemm_scratch_bytes(wt, K, N));
    for (int r = 0; r < N; r++) random_row(wt, w + (size_t)r * rb, K);
    if (wt == QF_TYPE_Q8_0) { /* the extremes of the signed range */
        block_q8_0 *b0 = (block_q8_0 *)(void *)w;
        b0->qs[0] = -128, b0->qs[1] = 127, b0->qs[31] = -128;
    } else if (wt == QF_TYPE_Q4_0) {
        block_q4_0 *b0 = (block_q4_0 *)(void *)w;
        b0->qs[0] = 0xF0, b0->qs[15] = 0x0F;
    } else { /* Q5_0: quants 0 and 31 */
        block_q5_0 *b0 = (block_q5_0 *)(void *)w;
        b0->qs[0] = 0xF0, b0->qh[0] = 0x01, b0->qh[2] = 0x00;
    }
    for (int64_t i = 0; i < (int64_t)n * K; i++) x[i] = rndf() * (i % 7 == 0 ? 10.0f : 1.0f);
    qf_gemm_quantize_act(wt, x, K, 0, n, act, tmp);
    { /* the fast activation quantizer is bit-identical to the scalar one (qf_quantize_row) */
        uint8_t *act_ref = qf_malloc_aligned(stride * (size_t)n);
        memset(act_ref, 0, stride * (size_t)n);
        qf_quant_force_scalar(true);
        qf_gemm_quantize_act(wt, x, K, 0, n, act_ref, tmp);
        qf_quant_force_scalar(false);
        size_t used = (size_t)K + (size_t)(K / 32) * 8, bad = 0;
        for (int t = 0; t < n; t++) bad += memcmp(act + (size_t)t * stride, act_ref + (size_t)t * stride, used) != 0;
        CHECK_MSG(bad == 0, "%s: %zu activation rows differ from the scalar quantizer", qf_type_name(wt), bad);
        free(act_ref);
    }
    for (int t = 0; t < n; t++)
        CHECK(qf_quantize_row(QF_TYPE_Q8_0, x + (size_t)t * K, xq + (size_t)t * qf_row_bytes(QF_TYPE_Q8_0, K), K));
    qf_gemm_q8_rows_ref(wt, w, rb, K, 0, N, act, n, yr, N);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < N; r++) {
            const uint8_t *wr = w + (size_t)r * rb, *xr = xq + (size_t)t * qf_row_bytes(QF_TYPE_Q8_0, K);
            double ref = qf_vec_dot_ref(wt, K, wr, xr);
            float wf[4096], xf[4096];
            qf_dequantize_row_ref(wt, wr, wf, K);
            qf_dequantize_row_ref(QF_TYPE_Q8_0, xr, xf, K);
            double mag = 0;
            for (int64_t i = 0; i < K; i++) mag += fabs((double)wf[i] * xf[i]);
            double e = fabs(yr[(size_t)t * N + r] - ref) / (mag > 0 ? mag : 1);
            if (e > worst) worst = e;
            /* the decode dot (AVX-512 VNNI where present: two blocks per step, odd last block) */
            e = fabs(qf_vec_dot(wt, K, wr, xr) - ref) / (mag > 0 ? mag : 1);
            if (e > worst) worst = e;
        }
    CHECK_MSG(worst < 1e-5, "%s gemm oracle vs vec_dot_ref: %.3e of sum|w*x|", qf_type_name(wt), worst);
    /* every panel kernel this CPU has (AVX-512 VNNI, AVX-VNNI, AVX2: qf_gemm_cap_isa forces the lower
     * ones), each bit-identical to the oracle */
    const qf_gemm_isa top = qf_gemm_isa_get();
    int ran = 0;
    for (int isa = QF_GEMM_ISA_AVX512; isa >= QF_GEMM_ISA_AVX2; isa--) {
        qf_gemm_cap_isa((qf_gemm_isa)isa);
        if (qf_gemm_isa_get() != (qf_gemm_isa)isa || isa > (int)top) continue;
        ran++;
        /* rows [3, N) into a matrix of stride N: a partial first panel of the tile too */
        for (size_t i = 0; i < (size_t)n * N; i++) yf[i] = -1.0f;
        int split = N < 3 ? N : 3;
        qf_gemm_q8_rows(wt, w, rb, K, 0, split, act, n, yf, N, scratch);
        qf_gemm_q8_rows(wt, w, rb, K, split, N, act, n, yf, N, scratch);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)n * N; i++) bad += memcmp(&yf[i], &yr[i], 4) != 0;
        CHECK_MSG(bad == 0, "%s gemm (isa %d) vs oracle: %zu of %zu differ", qf_type_name(wt), isa, bad, (size_t)n * N);
    }
    qf_gemm_cap_isa(QF_GEMM_ISA_AVX512);
    CHECK(top == QF_GEMM_ISA_NONE || ran >= (top == QF_GEMM_ISA_AVX512 ? 2 : 1)); /* AVX2 always among them */
    if (!ran) printf("  (no AVX2 here: the fast %s gemm is not run)\n", qf_type_name(wt));
    free(w), free(x), free(act), free(xq), free(tmp), free(yr), free(yf), free(scratch);
}

TEST(gemm_q8_vs_oracle) {
    CHECK(qf_gemm_q8_type(QF_TYPE_Q8_0) && qf_gemm_q8_type(QF_TYPE_Q4_0) && qf_gemm_q8_type(QF_TYPE_Q5_0) &&
          !qf_gemm_q8_type(QF_TYPE_F16));
    CHECK(!qf_gemm_q8_supported(QF_TYPE_Q4_K));
    const qf_type ts[] = {QF_TYPE_Q8_0, QF_TYPE_Q4_0, QF_TYPE_Q5_0};
    for (int i = 0; i < 3; i++) {
        check_gemm(ts[i], 32, 1, 1);
        check_gemm(ts[i], 96, 5, 3); /* an odd number of blocks */
        check_gemm(ts[i], 256, 37, 19);
        check_gemm(ts[i], 2048, 50, 70); /* > one 64-token block */
    }
    qf_quant_force_scalar(true);
    CHECK(!qf_gemm_q8_supported(QF_TYPE_Q8_0));
    qf_quant_force_scalar(false);
    /* capped at AVX2: the integer GEMM stays on, the AVX-512-only kernels go */
    if (qf_gemm_isa_get() != QF_GEMM_ISA_NONE) {
        qf_gemm_cap_isa(QF_GEMM_ISA_AVX2);
        CHECK(qf_gemm_q8_supported(QF_TYPE_Q4_0) && !qf_gemm_f16_supported() && !qf_gemm_k_supported(QF_TYPE_Q4_K) &&
              !qf_matvec_supported(QF_TYPE_Q4_0, 256));
        qf_gemm_cap_isa(QF_GEMM_ISA_AVX512);
    }
    printf("  gemm isa on this CPU: %d (3 AVX-512 VNNI, 2 AVX-VNNI, 1 AVX2)\n", (int)qf_gemm_isa_get());
}

/* The repacked Q4_0 panels (kernels/gemm.h Q4X16): the oracle reading the repacked bytes is
 * bit-identical to the GGUF-row oracle qf_gemm_q8_rows_ref (so the repack loses nothing), and the
 * AVX-512 kernel bit-identical to both, for the decode token counts (1-3: two int32 chains) and
 * prefill ones (partial groups of 8, > one 64-token block), a partial last panel (N % 16), a row
 * range that starts at a panel mid-matrix, and the extreme nibbles 0 / 15. */
static void check_q4x16(int64_t K, int N, int n) {
    const qf_type wt = QF_TYPE_Q4_0;
    size_t rb = qf_row_bytes(wt, K), stride = qf_gemm_act_stride(K);
    uint8_t *w = qf_malloc_aligned(rb * (size_t)N), *act = qf_malloc_aligned(stride * (size_t)n);
    uint8_t *wp = qf_malloc_aligned(qf_gemm_q4x16_bytes(K, N));
    float *x = qf_malloc_aligned((size_t)n * K * 4), *yr = qf_malloc_aligned((size_t)n * N * 4),
          *yp = qf_malloc_aligned((size_t)n * N * 4), *yf = qf_malloc_aligned((size_t)n * N * 4);
    void *tmp = qf_malloc_aligned(qf_row_bytes(QF_TYPE_Q8_0, K));
    for (int r = 0; r < N; r++) random_row(wt, w + (size_t)r * rb, K);
    block_q4_0 *b0 = (block_q4_0 *)(void *)w, *bl = (block_q4_0 *)(void *)(w + (size_t)(N - 1) * rb);
    b0->qs[0] = 0xF0, b0->qs[15] = 0x0F, bl[K / 32 - 1].qs[7] = 0xFF, bl[K / 32 - 1].qs[8] = 0x00;
    for (int64_t i = 0; i < (int64_t)n * K; i++) x[i] = rndf() * (i % 7 == 0 ? 10.0f : 1.0f);
    qf_gemm_quantize_act(wt, x, K, 0, n, act, tmp);
    CHECK(qf_gemm_q4x16_shape_ok(K, N));
    CHECK_EQ_INT(qf_gemm_q4x16_bytes(K, N), (size_t)((N + 15) / 16) * 16 * rb); /* the GGUF bytes, rearranged */
    int np = (N + 15) / 16, half = np / 2;
    qf_gemm_q4x16_pack(w, rb, K, N, half, np, wp); /* panels are independent: either order */
    qf_gemm_q4x16_pack(w, rb, K, N, 0, half, wp);
    qf_gemm_q8_rows_ref(wt, w, rb, K, 0, N, act, n, yr, N);
    qf_gemm_q4x16_rows_ref(wp, K, 0, N, act, n, yp, N);
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)n * N; i++) bad += memcmp(&yp[i], &yr[i], 4) != 0;
    CHECK_MSG(bad == 0, "q4x16 oracle vs gguf oracle (K %lld, N %d, n %d): %zu differ", (long long)K, N, n, bad);
    for (size_t i = 0; i < (size_t)n * N; i++) yf[i] = NAN;
    int split = N > 16 ? 16 : N;
    qf_gemm_q4x16_rows(wp, K, 0, split, act, n, yf, N);
    qf_gemm_q4x16_rows(wp, K, split, N, act, n, yf, N);
    bad = 0;
    for (size_t i = 0; i < (size_t)n * N; i++) bad += memcmp(&yf[i], &yr[i], 4) != 0;
    CHECK_MSG(bad == 0, "q4x16 %s vs oracle (K %lld, N %d, n %d): %zu differ",
              qf_gemm_q4x16_supported() ? "avx512" : "fallback", (long long)K, N, n, bad);
    free(w), free(act), free(wp), free(x), free(yr), free(yp), free(yf), free(tmp);
}

TEST(gemm_q4x16_vs_oracle) {
    CHECK(!qf_gemm_q4x16_shape_ok(96, 4) && !qf_gemm_q4x16_shape_ok(128, 0) && qf_gemm_q4x16_shape_ok(64, 1));
    if (!qf_gemm_q4x16_supported()) printf("  (no AVX-512 VNNI here: qf_gemm_q4x16_rows runs the oracle)\n");
    check_q4x16(64, 1, 1);
    check_q4x16(64, 16, 2);
    check_q4x16(192, 37, 3); /* an odd number of block pairs, a partial last panel */
    check_q4x16(2048, 50, 1);
    check_q4x16(2048, 50, 19);
    check_q4x16(8192, 33, 2);
    check_q4x16(512, 48, 70); /* > one 64-token block */
    qf_quant_force_scalar(true); /* the dispatch's fallback: the oracle itself */
    CHECK(!qf_gemm_q4x16_supported());
    check_q4x16(192, 37, 3);
    qf_quant_force_scalar(false);
}

/* The f16 prefill GEMM: the fast kernel (AVX-512, lanes over k) against the double-precision
 * oracle within 1e-5 of sum|w*x|, over partial row panels (N % 32), partial token groups (n % 12)
 * and more than one K block (K > QF_GEMM_F16_KB), partial 32-row panels. */
static void check_gemm_f16(int64_t K, int N, int n) {
    uint16_t *w = qf_malloc_aligned((size_t)N * K * 2);
    float *x = qf_malloc_aligned((size_t)n * K * 4), *yr = qf_malloc_aligned((size_t)n * N * 4),
          *yf = qf_malloc_aligned((size_t)n * N * 4);
    for (int64_t i = 0; i < (int64_t)N * K; i++) w[i] = qf_f32_to_f16(rndf());
    for (int64_t i = 0; i < (int64_t)n * K; i++) x[i] = rndf() * (i % 5 == 0 ? 8.0f : 1.0f);
    qf_gemm_f16_rows_ref(w, (size_t)K * 2, K, 0, N, x, n, yr, N);
    void *scratch = qf_malloc_aligned(qf_gemm_f16_scratch_bytes(N));
    qf_gemm_f16_rows(w, (size_t)K * 2, K, 0, 1, x, n, yf, N, scratch);
    qf_gemm_f16_rows(w, (size_t)K * 2, K, 1, N, x, n, yf, N, scratch);
    free(scratch);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < N; r++) {
            double mag = 0;
            for (int64_t k = 0; k < K; k++) mag += fabs((double)qf_f16_to_f32(w[(size_t)r * K + k]) * x[(size_t)t * K + k]);
            double e = fabs((double)yf[(size_t)t * N + r] - yr[(size_t)t * N + r]) / (mag > 0 ? mag : 1);
            if (e > worst) worst = e;
        }
    CHECK_MSG(worst < 1e-5, "f16 gemm K=%lld N=%d n=%d: %.3e of sum|w*x|", (long long)K, N, n, worst);
    free(w), free(x), free(yr), free(yf);
}

TEST(gemm_f16_vs_oracle) {
    if (!qf_gemm_f16_supported()) printf("  (no AVX-512 here: qf_gemm_f16_rows is the oracle itself)\n");
    check_gemm_f16(16, 1, 1);
    check_gemm_f16(256, 37, 29);  /* a last panel with 5 rows (its second half empty), 2 groups of 12 + 5 tokens */
    check_gemm_f16(512, 50, 12);  /* a last panel with 18 rows */
    check_gemm_f16(3 * QF_GEMM_F16_KB + 16, 9, 13); /* 4 K blocks, the last one 16 long */
    check_gemm_f16(2048, 128, 30);
}

/* The K-quant prefill GEMM: the oracle against qf_vec_dot_ref with the same Q8_K activations,
 * the fast kernel bit-identical to the oracle (partial panels, partial groups of 6 tokens). */
static void check_gemm_k(qf_type wt, int64_t K, int N, int n) {
    size_t rb = qf_row_bytes(wt, K), stride = qf_gemm_k_act_stride(K), xrb = qf_row_bytes(QF_TYPE_Q8_K, K);
    uint8_t *w = qf_malloc_aligned(rb * (size_t)N), *act = qf_malloc_aligned(stride * (size_t)n),
            *xq = qf_malloc_aligned(xrb * (size_t)n);
    float *x = qf_malloc_aligned((size_t)n * K * 4), *yr = qf_malloc_aligned((size_t)n * N * 4),
          *yf = qf_malloc_aligned((size_t)n * N * 4), *wf = qf_malloc_aligned((size_t)K * 4),
          *xf = qf_malloc_aligned((size_t)K * 4);
    void *tmp = qf_malloc_aligned(xrb), *scratch = qf_malloc_aligned(qf_gemm_k_scratch_bytes(wt, K, N));
    for (int r = 0; r < N; r++) random_row(wt, w + (size_t)r * rb, K);
    for (int64_t i = 0; i < (int64_t)n * K; i++) x[i] = rndf() * (i % 7 == 0 ? 10.0f : 1.0f);
    qf_gemm_k_quantize_act(x, K, 0, n, act, tmp);
    for (int t = 0; t < n; t++) CHECK(qf_quantize_row(QF_TYPE_Q8_K, x + (size_t)t * K, xq + (size_t)t * xrb, K));
    qf_gemm_k_rows_ref(wt, w, rb, K, 0, N, act, n, yr, N);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < N; r++) {
            const uint8_t *wr = w + (size_t)r * rb, *xr = xq + (size_t)t * xrb;
            double ref = qf_vec_dot_ref(wt, K, wr, xr);
            qf_dequantize_row_ref(wt, wr, wf, K);
            qf_dequantize_row_ref(QF_TYPE_Q8_K, xr, xf, K);
            double mag = 0;
            for (int64_t i = 0; i < K; i++) mag += fabs((double)wf[i] * xf[i]);
            double e = fabs(yr[(size_t)t * N + r] - ref) / (mag > 0 ? mag : 1);
            if (e > worst) worst = e;
        }
    CHECK_MSG(worst < 1e-5, "%s gemm oracle vs vec_dot_ref: %.3e of sum|w*x|", qf_type_name(wt), worst);
    if (qf_gemm_k_supported(wt)) {
        for (size_t i = 0; i < (size_t)n * N; i++) yf[i] = -1.0f;
        int split = N < 5 ? N : 5;
        qf_gemm_k_rows(wt, w, rb, K, 0, split, act, n, yf, N, scratch);
        qf_gemm_k_rows(wt, w, rb, K, split, N, act, n, yf, N, scratch);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)n * N; i++) bad += memcmp(&yf[i], &yr[i], 4) != 0;
        CHECK_MSG(bad == 0, "%s gemm avx512 vs oracle: %zu of %zu differ", qf_type_name(wt), bad, (size_t)n * N);
    }
    free(w), free(act), free(xq), free(x), free(yr), free(yf), free(wf), free(xf), free(tmp), free(scratch);
}

TEST(gemm_k_vs_oracle) {
    CHECK(qf_gemm_k_type(QF_TYPE_Q4_K) && qf_gemm_k_type(QF_TYPE_Q6_K) && !qf_gemm_k_type(QF_TYPE_Q5_K));
    const qf_type ts[] = {QF_TYPE_Q4_K, QF_TYPE_Q6_K};
    for (int i = 0; i < 2; i++) {
        check_gemm_k(ts[i], 256, 1, 1);
        check_gemm_k(ts[i], 512, 37, 19);
        check_gemm_k(ts[i], 2048, 20, 70);
    }
}

/* The decode matvec (kernels/matvec.h): the fast multi-row kernel against the oracle (per-row
 * qf_vec_dot_ref on the same quantized activation) within 1e-5 of sum|w*x|, over row counts that
 * leave a partial group of 4 rows, a row range that starts mid-matrix, and Q4_0's extreme nibbles;
 * also the oracle against double math on the dequantized rows. */
static void check_matvec(qf_type wt, int64_t K, int N) {
    size_t rb = qf_row_bytes(wt, K);
    uint8_t *w = qf_malloc_aligned(rb * (size_t)N);
    float *x = qf_malloc_aligned((size_t)K * 4), *yr = qf_malloc_aligned((size_t)N * 4), *yf = qf_malloc_aligned((size_t)N * 4);
    float *wf = qf_malloc_aligned((size_t)K * 4), *xf = qf_malloc_aligned((size_t)K * 4);
    qf_type vt = qf_vec_dot_type(wt);
    void *xq = qf_malloc_aligned(qf_row_bytes(vt, K));
    for (int r = 0; r < N; r++) random_row(wt, w + (size_t)r * rb, K);
    if (wt == QF_TYPE_Q4_0) {
        block_q4_0 *b0 = (block_q4_0 *)(void *)w;
        b0->qs[0] = 0xF0, b0->qs[15] = 0x0F;
    }
    for (int64_t i = 0; i < K; i++) x[i] = rndf() * (i % 7 == 0 ? 10.0f : 1.0f);
    qf_matvec_rows_ref(wt, w, rb, K, 0, N, x, yr, xq);
    qf_dequantize_row_ref(vt, xq, xf, K);
    double worst_ref = 0, worst = 0;
    double *mag = malloc((size_t)N * sizeof(double));
    for (int r = 0; r < N; r++) {
        qf_dequantize_row_ref(wt, w + (size_t)r * rb, wf, K);
        double exact = 0, m = 0;
        for (int64_t i = 0; i < K; i++) exact += (double)wf[i] * xf[i], m += fabs((double)wf[i] * xf[i]);
        mag[r] = m > 0 ? m : 1;
        double e = fabs(yr[r] - exact) / mag[r];
        if (e > worst_ref) worst_ref = e;
    }
    CHECK_MSG(worst_ref < 1e-5, "%s matvec oracle vs exact: %.3e of sum|w*x|", qf_type_name(wt), worst_ref);
    if (qf_matvec_supported(wt, K)) {
        void *act = qf_malloc_aligned(qf_matvec_act_bytes(wt, K));
        qf_matvec_prepare(wt, x, K, act);
        for (int r = 0; r < N; r++) yf[r] = NAN;
        int split = N < 3 ? N : 3;
        qf_matvec_rows(wt, w, rb, K, 0, split, act, yf);
        qf_matvec_rows(wt, w, rb, K, split, N, act, yf);
        for (int r = 0; r < N; r++) {
            double e = isnan(yf[r]) ? 1 : fabs(yf[r] - yr[r]) / mag[r];
            if (e > worst) worst = e;
        }
        CHECK_MSG(worst < 1e-5, "%s matvec fast vs oracle (K %lld, %d rows): %.3e of sum|w*x|", qf_type_name(wt),
                  (long long)K, N, worst);
        free(act);
    } else {
        printf("  (no fast %s matvec on this CPU for K %lld)\n", qf_type_name(wt), (long long)K);
    }
    free(mag), free(w), free(x), free(yr), free(yf), free(wf), free(xf), free(xq);
}

TEST(matvec_vs_oracle) {
    const qf_type ts[] = {QF_TYPE_Q4_0, QF_TYPE_F16, QF_TYPE_Q4_K, QF_TYPE_Q5_K, QF_TYPE_Q6_K};
    for (int i = 0; i < 5; i++) {
        if (qf_type_block_elems(ts[i]) < 256) check_matvec(ts[i], 128, 1);
        check_matvec(ts[i], 256, 7);
        check_matvec(ts[i], 2048, 37);
        check_matvec(ts[i], 8192, 9);
    }
    { /* the F16 activation is the f16 round trip of x bit for bit (qf_f32_to_f16 / qf_f16_to_f32), specials too */
        const int64_t K = 384;
        float *x = qf_malloc_aligned(K * 4), *o = qf_malloc_aligned(qf_matvec_act_bytes(QF_TYPE_F16, K));
        for (int64_t i = 0; i < K; i++) x[i] = rndf() * (i % 3 ? 1.0f : 3e4f);
        const float sp[] = {-0.0f, 1e-8f, -3e-6f, 6.0e-5f, 65504.0f, 65519.0f, 65520.0f, -1e6f, INFINITY, -INFINITY};
        memcpy(x + 100, sp, sizeof sp);
        if (qf_matvec_supported(QF_TYPE_F16, K)) {
            qf_matvec_prepare(QF_TYPE_F16, x, K, o);
            size_t bad = 0;
            for (int64_t i = 0; i < K; i++) {
                float r = qf_f16_to_f32(qf_f32_to_f16(x[i]));
                bad += memcmp(&o[i], &r, 4) != 0;
            }
            CHECK_MSG(bad == 0, "f16 matvec activation: %zu of %lld differ from the scalar round trip", bad, (long long)K);
        }
        free(x), free(o);
    }
    CHECK(!qf_matvec_supported(QF_TYPE_Q4_0, 96)); /* K not a multiple of 128: the vec_dot route */
    CHECK(!qf_matvec_supported(QF_TYPE_Q8_0, 256) && !qf_matvec_supported(QF_TYPE_Q5_0, 256)); /* the vec_dot route */
    CHECK(!qf_matvec_supported(QF_TYPE_Q4_K, 128) && !qf_matvec_supported(QF_TYPE_Q6_K, 384)); /* not whole 256-blocks */
    qf_quant_force_scalar(true);
    CHECK(!qf_matvec_supported(QF_TYPE_Q4_0, 256) && !qf_matvec_supported(QF_TYPE_F16, 256));
    CHECK(!qf_matvec_supported(QF_TYPE_Q4_K, 256) && !qf_matvec_supported(QF_TYPE_Q5_K, 256) &&
          !qf_matvec_supported(QF_TYPE_Q6_K, 256));
    qf_quant_force_scalar(false);
}

int main(void) {
    RUN(type_table);
    RUN(bad_input_is_refused);
    RUN(oracle_known_values);
    RUN(quantize_round_trip);
    RUN(q6k_g8_layout);
    RUN(force_scalar);
    RUN(random_fast_vs_oracle);
    RUN(gemm_q8_vs_oracle);
    RUN(gemm_q4x16_vs_oracle);
    RUN(gemm_f16_vs_oracle);
    RUN(gemm_k_vs_oracle);
    RUN(matvec_vs_oracle);
    RUN(real_q4_k_m);
    RUN(real_qwen2_q4_k_m);
    RUN(real_q8_0);
    RUN(real_f16);
    RUN(real_f32);
    RUN(layout_q8_0_vs_f16);
    RUN(layout_q4_k_m_vs_f16);
    RUN(layout_qwen2_q4_k_m_vs_f16);
    return test_summary();
}
