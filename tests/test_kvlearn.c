/* test_kvlearn.c: the KV learners and the go/no-go on synthetic vectors: OMP exact
 * recovery, k-SVD monotonicity, determinism across seeds and thread counts, int8 round
 * trip bounds, the Hadamard transform, code packing, and the analysis + SVG end to end. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_codes.h"
#include "kernels/hadamard.h"
#include "qforge/kvlearn.h"
#include "test.h"
#include "util/util.h"

static uint64_t rng_state = 12345;
static double urand(void) { /* [0, 1) */
    return qf_rand_unit(&rng_state);
}
static double nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static float *random_dict(int A, int dim) {
    float *D = malloc(sizeof(float) * (size_t)A * dim);
    for (int i = 0; i < A * dim; i++) D[i] = (float)nrand();
    return D;
}

/* n vectors, each a k-sparse combination of the atoms of D (+ noise). */
static float *sparse_data(const float *D, int A, int dim, int64_t n, int k, double noise) {
    float *X = calloc((size_t)n * dim, sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < k; j++) {
            int a = (int)(urand() * A);
            double c = (0.5 + urand()) * (urand() < 0.5 ? -1 : 1);
            double nn = 0;
            for (int t = 0; t < dim; t++) nn += (double)D[a * dim + t] * D[a * dim + t];
            for (int t = 0; t < dim; t++) X[i * dim + t] += (float)(c * D[a * dim + t] / sqrt(nn));
        }
        for (int t = 0; t < dim; t++) X[i * dim + t] += (float)(noise * nrand());
    }
    return X;
}

TEST(omp_recovers_sparse_signals) {
    const int A = 128, dim = 64, k = 4, n = 200;
    rng_state = 1;
    float *D = random_dict(A, dim);
    qf_kv_dict d;
    qf_error e;
    CHECK(qf_kv_dict_init(&d, D, A, dim, &e) == QF_OK);
    float *X = calloc((size_t)n * dim, sizeof(float));
    int *truth = malloc(sizeof(int) * n * k);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) {
            int a;
            bool dup;
            do { /* distinct atoms */
                a = (int)(urand() * A);
                dup = false;
                for (int m = 0; m < j; m++) dup |= truth[i * k + m] == a;
            } while (dup);
            truth[i * k + j] = a;
            double c = (0.5 + urand()) * (urand() < 0.5 ? -1 : 1);
            for (int t = 0; t < dim; t++) X[i * dim + t] += (float)c * d.atoms[a * dim + t];
        }
    uint16_t *idx = malloc(sizeof(uint16_t) * n * k);
    float *coef = malloc(sizeof(float) * n * k);
    float *rec = malloc(sizeof(float) * n * dim);
    CHECK(qf_kv_dict_encode(&d, X, n, k, 2, idx, coef, &e) == QF_OK);
    qf_kv_dict_decode(&d, idx, coef, k, n, rec);
    double worst = 0;
    int support_ok = 0;
    for (int i = 0; i < n; i++) {
        double num = 0, den = 0;
        for (int t = 0; t < dim; t++) {
            double df = (double)X[i * dim + t] - rec[i * dim + t];
            num += df * df;
            den += (double)X[i * dim + t] * X[i * dim + t];
        }
        worst = fmax(worst, sqrt(num / den));
        int hit = 0;
        for (int j = 0; j < k; j++)
            for (int m = 0; m < k; m++) hit += idx[i * k + j] == truth[i * k + m];
        support_ok += hit == k;
    }
    CHECK_MSG(worst < 1e-6, "worst relative recovery error %g", worst);
    CHECK_EQ_INT(support_ok, n);
    /* a zero vector encodes to nothing */
    float z[64] = {0};
    CHECK(qf_kv_dict_encode(&d, z, 1, k, 1, idx, coef, &e) == QF_OK);
    for (int j = 0; j < k; j++) CHECK(coef[j] == 0);
    /* bad sparsity is an error, not a crash */
    CHECK(qf_kv_dict_encode(&d, X, 1, dim + 1, 1, idx, coef, &e) == QF_ERR_ARG);
    qf_kv_dict_free(&d);
    free(D), free(X), free(truth), free(idx), free(coef), free(rec);
}

TEST(ksvd_error_never_increases) {
    const int A = 48, dim = 32, s = 3, iters = 12;
    const int64_t n = 3000;
    rng_state = 2;
    float *D = random_dict(A, dim);
    float *X = sparse_data(D, A, dim, n, s, 0.02);
    qf_kv_dict_params p;
    qf_kv_dict_params_default(&p);
    p.n_atoms = A;
    p.sparsity = s;
    p.iters = iters;
    double trace[13];
    p.err_trace = trace;
    qf_kv_dict d;
    qf_error e;
    CHECK(qf_kv_dict_learn(X, n, dim, &p, &d, &e) == QF_OK);
    for (int t = 1; t <= iters; t++)
        CHECK_MSG(trace[t] <= trace[t - 1] * (1 + 1e-6) + 1e-12, "iter %d: %.9g > %.9g", t,
                  trace[t], trace[t - 1]);
    CHECK_MSG(trace[iters] < 0.5 * trace[0], "learning gained too little: %g -> %g", trace[0],
              trace[iters]);
    for (int t = 0; t <= iters; t++) CHECK(trace[t] >= 0 && trace[t] <= 1);
    for (int a = 0; a < A; a++) { /* unit-norm atoms */
        double nn = 0;
        for (int t = 0; t < dim; t++) nn += (double)d.atoms[a * dim + t] * d.atoms[a * dim + t];
        CHECK_NEAR(nn, 1.0, 1e-5);
    }
    qf_kv_dict_free(&d);
    /* too few vectors for the atoms: a clear error */
    p.n_atoms = 4000;
    CHECK(qf_kv_dict_learn(X, n, dim, &p, &d, &e) == QF_ERR_ARG);
    CHECK(strstr(e.msg, "training vectors") != NULL);
    free(D), free(X);
}

TEST(learning_is_deterministic_and_thread_independent) {
    const int A = 64, dim = 16, s = 4;
    const int64_t n = 2500;
    rng_state = 3;
    float *D = random_dict(A, dim);
    float *X = sparse_data(D, A, dim, n, s, 0.1);
    qf_kv_dict_params p;
    qf_kv_dict_params_default(&p);
    p.n_atoms = A;
    p.sparsity = s;
    p.iters = 4;
    p.seed = 7;
    qf_kv_dict d1, d2, d3, d4;
    qf_error e;
    p.n_threads = 1;
    CHECK(qf_kv_dict_learn(X, n, dim, &p, &d1, &e) == QF_OK);
    p.n_threads = 2;
    CHECK(qf_kv_dict_learn(X, n, dim, &p, &d2, &e) == QF_OK);
    p.n_threads = 3;
    CHECK(qf_kv_dict_learn(X, n, dim, &p, &d3, &e) == QF_OK);
    p.seed = 8;
    CHECK(qf_kv_dict_learn(X, n, dim, &p, &d4, &e) == QF_OK);
    size_t bytes = sizeof(float) * A * dim;
    CHECK(memcmp(d1.atoms, d2.atoms, bytes) == 0);
    CHECK(memcmp(d1.atoms, d3.atoms, bytes) == 0);
    CHECK(memcmp(d1.atoms, d4.atoms, bytes) != 0);
    /* encoding, too */
    uint16_t *i1 = malloc(sizeof(uint16_t) * n * s), *i2 = malloc(sizeof(uint16_t) * n * s);
    float *c1 = malloc(sizeof(float) * n * s), *c2 = malloc(sizeof(float) * n * s);
    CHECK(qf_kv_dict_encode(&d1, X, n, s, 1, i1, c1, &e) == QF_OK);
    CHECK(qf_kv_dict_encode(&d1, X, n, s, 2, i2, c2, &e) == QF_OK);
    CHECK(memcmp(i1, i2, sizeof(uint16_t) * n * s) == 0);
    CHECK(memcmp(c1, c2, sizeof(float) * n * s) == 0);
    qf_kv_dict_free(&d1), qf_kv_dict_free(&d2), qf_kv_dict_free(&d3), qf_kv_dict_free(&d4);
    free(D), free(X), free(i1), free(i2), free(c1), free(c2);
}

TEST(code_packing_matches_rounded_decode) {
    const int dim = 16, s = 3;
    rng_state = 4;
    for (int A = 200; A <= 300; A += 100) { /* u8 and u16 indices */
        float *D = random_dict(A, dim);
        qf_kv_dict d;
        qf_error e;
        CHECK(qf_kv_dict_init(&d, D, A, dim, &e) == QF_OK);
        for (int f = 0; f < 2; f++) {
            uint16_t idx[3] = {1, (uint16_t)(A - 1), 77};
            float coef[3] = {0.75f, -2.5f, 0.01f};
            uint8_t code[16];
            CHECK_EQ_INT(qf_kv_code_bytes(A, s, (qf_kv_coef)f),
                         (A <= 256 ? 3 : 6) + (f == QF_KV_COEF_Q8 ? 5 : 6));
            qf_kv_code_pack(idx, coef, s, A, (qf_kv_coef)f, code);
            float a[16], b[16];
            qf_kv_code_decode(&d, code, s, (qf_kv_coef)f, a);
            qf_kv_coef_round(coef, s, (qf_kv_coef)f);
            qf_kv_dict_decode(&d, idx, coef, s, 1, b);
            for (int t = 0; t < dim; t++) CHECK_NEAR(a[t], b[t], 1e-6);
            CHECK_NEAR(coef[1], -2.5, f == QF_KV_COEF_Q8 ? 2.5 / 254 + 1e-3 : 1e-3);
        }
        qf_kv_dict_free(&d);
        free(D);
    }
    CHECK_NEAR(qf_kv_code_bits(256, 4, QF_KV_COEF_F16), 96, 0);
    CHECK_NEAR(qf_kv_code_bits(256, 8, QF_KV_COEF_Q8), 8 * 16 + 16, 0);
    float bad[16] = {0};
    qf_kv_dict d;
    qf_error e;
    CHECK(qf_kv_dict_init(&d, bad, 1, 16, &e) == QF_ERR_FORMAT); /* zero atom */
}


/* qf_kv_dict_encode (what every learner measurement uses) is bit for bit the engine's
 * encoder (what the dict cache stores): same indices, same coefficients. */
TEST(measurement_uses_the_engine_encoder) {
    const int A = 96, dim = 32, s = 6;
    const int64_t n = 300;
    rng_state = 21;
    float *D = random_dict(A, dim);
    float *X = sparse_data(D, A, dim, n, 5, 0.05);
    qf_kv_dict d;
    qf_error e;
    CHECK(qf_kv_dict_init(&d, D, A, dim, &e) == QF_OK);
    uint16_t *i1 = malloc(sizeof(uint16_t) * n * s), i2[8];
    float *c1 = malloc(sizeof(float) * n * s), c2[8];
    void *scratch = malloc(qf_kv_omp_scratch_bytes(A, s));
    for (int tol = 0; tol < 2; tol++) {
        double t = tol ? 0.2 : 0;
        CHECK(qf_kv_dict_encode_ex(&d, X, n, s, t, 2, i1, c1, NULL, &e) == QF_OK);
        int same = 0;
        for (int64_t i = 0; i < n; i++) {
            qf_kv_omp_ex(&d, X + i * dim, NULL, s, t, scratch, i2, c2);
            same += !memcmp(i1 + i * s, i2, sizeof(uint16_t) * s) && !memcmp(c1 + i * s, c2, sizeof(float) * s);
        }
        CHECK_EQ_INT(same, n);
    }
    /* one dictionary validation: a zero atom is FORMAT, a bad count ARG, everywhere */
    qf_kv_dict_free(&d);
    CHECK(qf_kv_dict_init(&d, D, QF_KV_MAX_ATOMS + 1, dim, &e) == QF_ERR_ARG);
    free(D), free(X), free(i1), free(c1), free(scratch);
}

/* qf_kv_omp_gd (the learner's encoder: Cholesky dots read from qf_kv_gram_d's table) gives
 * qf_kv_omp_ex's codes bit for bit: fixed and error-bounded, correlations computed or passed,
 * near-duplicate atoms (pivot stops), a zero vector and a NaN. */
TEST(omp_with_gram_table_is_bit_identical) {
    const int shapes[2][3] = {{96, 32, 6}, {256, 128, 16}};
    for (int sh = 0; sh < 2; sh++) {
        const int A = shapes[sh][0], dim = shapes[sh][1], s = shapes[sh][2];
        const int64_t n = 400;
        rng_state = 31 + (uint64_t)sh;
        float *D = random_dict(A, dim);
        for (int t = 0; t < dim; t++) D[5 * dim + t] = D[4 * dim + t] + 1e-4f * (float)nrand(); /* near twins */
        float *X = sparse_data(D, A, dim, n, s / 2 + 1, 0.02);
        memset(X, 0, sizeof(float) * (size_t)dim); /* vector 0: zero */
        X[dim + 3] = NAN;                           /* vector 1: a NaN */
        for (int t = 0; t < dim; t++) X[2 * dim + t] = D[4 * dim + t] - D[5 * dim + t] + D[7 * dim + t];
        qf_kv_dict d;
        qf_error e;
        CHECK(qf_kv_dict_init(&d, D, A, dim, &e) == QF_OK);
        double *gd = malloc(sizeof(double) * (size_t)A * A);
        qf_kv_gram_d(&d, gd);
        CHECK(gd[4 * A + 5] == gd[5 * A + 4]);
        void *scratch = malloc(qf_kv_omp_scratch_bytes(A, s));
        float *al0 = malloc(sizeof(float) * (size_t)A), c1[16], c2[16];
        uint16_t i1[16], i2[16];
        int same = 0, total = 0, cut = 0;
        for (int tol = 0; tol < 2; tol++)
            for (int pass = 0; pass < 2; pass++)
                for (int64_t i = 0; i < n; i++) {
                    const float *x = X + i * dim;
                    const float *a0 = NULL;
                    if (pass) { /* the training path: correlations from outside */
                        for (int a = 0; a < A; a++) {
                            float acc = 0;
                            for (int t = 0; t < dim; t++) acc += D[a * dim + t] * x[t];
                            al0[a] = acc;
                        }
                        a0 = al0;
                    }
                    int k1 = qf_kv_omp_ex(&d, x, a0, s, tol ? 0.15 : 0, scratch, i1, c1);
                    int k2 = qf_kv_omp_gd(&d, gd, x, a0, s, tol ? 0.15 : 0, scratch, i2, c2);
                    same += k1 == k2 && !memcmp(i1, i2, sizeof(uint16_t) * (size_t)s) &&
                            !memcmp(c1, c2, sizeof(float) * (size_t)s);
                    cut += k1 < s;
                    total++;
                }
        printf("  %d atoms x %d, s %d: %d of %d codes identical (%d stopped early)\n", A, dim, s, same, total, cut);
        CHECK_EQ_INT(same, total);
        CHECK(cut > 4); /* the zero vector, the NaN and the error bound stop early */
        qf_kv_dict_free(&d);
        free(D), free(X), free(gd), free(scratch), free(al0);
    }
}

/* Error-bounded OMP stops once ||r|| <= tol ||x|| (fewer atoms than the cap for easy vectors),
 * and 4096-atom codes with 12-bit packed indices round-trip through pack/decode. */
TEST(error_bounded_omp_and_packed_indices) {
    const int A = 4096, dim = 32, s = 8;
    const int64_t n = 400;
    rng_state = 22;
    float *D = random_dict(A, dim);
    float *X = sparse_data(D, A, dim, n, 3, 0.01);
    qf_kv_dict d;
    qf_error e;
    CHECK(qf_kv_dict_init(&d, D, A, dim, &e) == QF_OK);
    uint16_t *idx = malloc(sizeof(uint16_t) * n * s);
    float *coef = malloc(sizeof(float) * n * s), *rec = malloc(sizeof(float) * dim);
    uint8_t *used = malloc((size_t)n);
    const double tol = 0.1;
    CHECK(qf_kv_dict_encode_ex(&d, X, n, s, tol, 1, idx, coef, used, &e) == QF_OK);
    int64_t sum_used = 0, viol = 0;
    for (int64_t i = 0; i < n; i++) {
        sum_used += used[i];
        qf_kv_dict_decode(&d, idx + i * s, coef + i * s, s, 1, rec);
        double r = sqrt(qf_rel_mse(X + i * dim, rec, dim));
        if (used[i] < s && r > tol * (1 + 1e-6)) viol++;
        for (int j = used[i]; j < s; j++) CHECK(coef[i * s + j] == 0);
    }
    printf("  error-bounded OMP, tol %.2f: %.2f atoms per vector (cap %d)\n", tol, (double)sum_used / n, s);
    CHECK_EQ_INT(viol, 0);
    CHECK(sum_used < n * s);
    /* packed layout: 8 x 12 bits = 12 bytes of indices + q8 coefficients */
    qf_kv_code_fmt f = {.n_atoms = A, .sparsity = s, .coef = QF_KV_COEF_Q8, .packed = true};
    CHECK_EQ_INT(qf_kv_fmt_bytes(&f), 12 + 2 + 8);
    CHECK_EQ_INT(qf_kv_index_bits(A), 12);
    uint8_t code[64];
    uint16_t ti[8] = {0, 4095, 1, 2048, 4094, 7, 300, 1234};
    float tc[8] = {1, -2, 0.5f, 0.25f, -1, 0, 3, 0.1f}, a[32], b[32];
    for (int fc = 0; fc < 2; fc++) {
        f.coef = (qf_kv_coef)fc;
        qf_kv_fmt_pack(&f, ti, tc, code);
        qf_kv_fmt_decode(&f, &d, code, a);
        float rc[8];
        memcpy(rc, tc, sizeof rc);
        qf_kv_coef_round(rc, s, f.coef);
        qf_kv_dict_decode(&d, ti, rc, s, 1, b);
        for (int t = 0; t < dim; t++) CHECK_NEAR(a[t], b[t], 1e-5);
    }
    qf_kv_dict_free(&d);
    free(D), free(X), free(idx), free(coef), free(rec), free(used);
}

TEST(int8_round_trip_bounds) {
    const int H = 2, dim = 32;
    const int64_t rows = 500, n = rows * H;
    rng_state = 5;
    float *X = malloc(sizeof(float) * n * dim);
    for (int64_t i = 0; i < n * dim; i++) X[i] = (float)(nrand() * (1 + (i % dim)));
    float scale[64], inv[64], rec[64];
    int8_t q[64];
    qf_error e;
    for (int mode = 0; mode < 2; mode++) {
        CHECK(qf_kv_int8_fit(X, n, H, dim, (qf_kv_scale_mode)mode, 100, scale, &e) == QF_OK);
        qf_kv_int8_inv_scale(scale, inv, H * dim);
        double worst = 0;
        for (int64_t r = 0; r < rows; r++) {
            const float *x = X + r * H * dim;
            qf_kv_int8_quantize(x, inv, q, H * dim);
            qf_kv_int8_dequantize(q, scale, rec, H * dim);
            for (int i = 0; i < H * dim; i++) {
                CHECK(q[i] >= -127 && q[i] <= 127);
                worst = fmax(worst, fabs(x[i] - rec[i]) / scale[i]);
            }
        }
        CHECK_MSG(worst <= 0.5 + 1e-4, "mode %d: error %g scale steps", mode, worst);
        if (mode == QF_KV_SCALE_PER_HEAD)
            for (int t = 1; t < dim; t++) CHECK(scale[t] == scale[0]);
    }
    /* a percentile clips: the largest values saturate instead of widening the scale */
    float s100[64], s99[64];
    CHECK(qf_kv_int8_fit(X, n, H, dim, QF_KV_SCALE_PER_CHANNEL, 100, s100, &e) == QF_OK);
    CHECK(qf_kv_int8_fit(X, n, H, dim, QF_KV_SCALE_PER_CHANNEL, 99, s99, &e) == QF_OK);
    for (int i = 0; i < H * dim; i++) CHECK(s99[i] < s100[i]);
    float big[2] = {1e30f, NAN}, one[2] = {1, 1}, bb[2];
    int8_t qb[2];
    qf_kv_int8_quantize(big, one, qb, 2);
    CHECK(qb[0] == 127 && qb[1] == -127);
    qf_kv_int8_dequantize(qb, one, bb, 2);
    CHECK(bb[0] == 127);
    /* bad input */
    CHECK(qf_kv_int8_fit(X, n - 1, H, dim, QF_KV_SCALE_PER_CHANNEL, 100, scale, &e) == QF_ERR_ARG);
    CHECK(qf_kv_int8_fit(X, n, H, dim, QF_KV_SCALE_PER_CHANNEL, 0, scale, &e) == QF_ERR_ARG);
    X[5] = NAN;
    CHECK(qf_kv_int8_fit(X, n, H, dim, QF_KV_SCALE_PER_CHANNEL, 100, scale, &e) == QF_ERR_ARG);
    free(X);
}

TEST(hadamard_is_orthonormal) {
    const int n = 64;
    float *Hm = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n; i++) { /* row i = H e_i (H is symmetric) */
        memset(Hm + i * n, 0, sizeof(float) * n);
        Hm[i * n + i] = 1;
        qf_hadamard(Hm + i * n, n);
    }
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double dd = 0;
            for (int t = 0; t < n; t++) dd += (double)Hm[i * n + t] * Hm[j * n + t];
            worst = fmax(worst, fabs(dd - (i == j)));
        }
    CHECK_MSG(worst < 1e-6, "H H^T - I: %g", worst);
    float x[64], y[64];
    rng_state = 6;
    for (int i = 0; i < n; i++) x[i] = y[i] = (float)nrand();
    qf_hadamard(y, n);
    qf_hadamard(y, n);
    for (int i = 0; i < n; i++) CHECK_NEAR(x[i], y[i], 1e-5);
    qf_error e;
    CHECK(qf_kv_rt_hadamard(x, 1, 48, 4, y, &e) == QF_ERR_ARG);
    free(Hm);
}

TEST(relative_errors_are_in_unit_interval) {
    float x[8] = {1, -2, 3, 0, 5, 6, -7, 8}, y[8], z[8] = {0};
    for (int i = 0; i < 8; i++) y[i] = -3 * x[i];
    CHECK(qf_rel_mse(x, y, 8) == 1.0);
    CHECK(qf_rel_mse(x, x, 8) == 0.0);
    CHECK(qf_rel_mse(z, z, 8) == 0.0);
    CHECK(qf_rel_mse(z, x, 8) == 1.0);
    y[0] = NAN;
    CHECK(qf_rel_mse(x, y, 8) == 1.0);
    const int dim = 64;
    const int64_t n = 256;
    rng_state = 7;
    float *X = malloc(sizeof(float) * n * dim), *R = malloc(sizeof(float) * n * dim);
    for (int64_t i = 0; i < n * dim; i++) X[i] = (float)(nrand() + (i % dim == 3 ? 20 : 0));
    double prev_u = 1.1, prev_c = 1.1;
    for (int b = 2; b <= 8; b++) {
        qf_kv_rt_uniform(X, n, dim, b, R);
        double eu = qf_rel_mse(X, R, n * dim);
        qf_kv_rt_per_channel(X, n, dim, 2, 32, b, R);
        double ec = qf_rel_mse(X, R, n * dim);
        qf_error e;
        CHECK(qf_kv_rt_hadamard(X, n, dim, b, R, &e) == QF_OK);
        double eh = qf_rel_mse(X, R, n * dim);
        CHECK(eu >= 0 && eu <= 1 && ec >= 0 && ec <= 1 && eh >= 0 && eh <= 1);
        CHECK(eu < prev_u && ec < prev_c); /* more bits, less error */
        prev_u = eu, prev_c = ec;
        /* the outlier channel hurts per-vector absmax; the rotation spreads it */
        if (b >= 4) CHECK(eh < eu);
    }
    CHECK_NEAR(qf_kv_bits_uniform(64, 4), 4.25, 1e-12);
    CHECK_NEAR(qf_kv_bits_per_channel(64, 2), 2.5, 1e-12);
    free(X), free(R);
}

TEST(analysis_end_to_end) {
    const int L = 2, H = 2, dim = 32, A = 24;
    const int64_t n = 1200; /* per layer and stream */
    rng_state = 8;
    float *D = random_dict(A, dim);
    float *kv[4];
    for (int i = 0; i < 4; i++) kv[i] = sparse_data(D, A, dim, n, 2, 0.01);
    const float *k[2] = {kv[0], kv[1]}, *v[2] = {kv[2], NULL}; /* layer 1 V not captured */
    int64_t nk[2] = {n, n}, nv[2] = {n, 0};
    qf_kv_capture_view cap = {L, H, dim, k, v, nk, nv};
    qf_kv_analysis_params p;
    qf_kv_analysis_params_default(&p);
    p.n_atoms = A;
    p.sparsity = 2;
    p.iters = 6;
    p.n_threads = 2;
    p.n_rd = 2;
    p.rd_atoms[0] = 16, p.rd_sparsity[0] = 1;
    p.rd_atoms[1] = A, p.rd_sparsity[1] = 2;
    p.rd_iters = 6;
    qf_kv_report r;
    qf_error e;
    CHECK(qf_kv_analyze(&cap, &p, &r, &e) == QF_OK);
    CHECK_EQ_INT(r.n_layers, 3);
    for (int i = 0; i < r.n_layers; i++) {
        const qf_kv_layer_verdict *lv = &r.layers[i];
        CHECK(lv->recon_dict >= 0 && lv->recon_dict <= 1);
        CHECK(lv->recon_int8 >= 0 && lv->recon_int8 <= 1e-3);
        CHECK(lv->recon_int8_static >= 0 && lv->recon_int8_static <= 1e-2);
        CHECK_EQ_INT(lv->n_train + lv->n_eval, n);
        CHECK(lv->go); /* the data are 2-sparse in a 24-atom dictionary: it must win */
        CHECK_EQ_INT(lv->rd.n_curves, 4);
    }
    CHECK(r.overall_go);
    CHECK_EQ_INT(r.rd_all.n_curves, 4);
    CHECK_EQ_INT(r.rd_all.curves[3].n, 2);
    CHECK(r.rd_all.curves[3].bits[0] < r.rd_all.curves[3].bits[1]);
    CHECK(r.dict_bytes_per_token < r.int8_bytes_per_token);
    char path[4200];
    snprintf(path, sizeof path, "%s/rd.svg", test_tmpdir());
    CHECK(qf_kv_rd_write_svg(&r.rd_all, path, &e) == QF_OK);
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL);
    if (fp) {
        char buf[8192];
        size_t got = fread(buf, 1, sizeof buf - 1, fp);
        buf[got] = 0;
        fclose(fp);
        CHECK(strncmp(buf, "<?xml", 5) == 0);
        CHECK(strstr(buf, "<polyline") != NULL);
        CHECK(strstr(buf, "per-channel") != NULL);
    }
    FILE *devnull = getenv("KV_VERBOSE") ? stdout : fopen("/dev/null", "w");
    qf_kv_report_print(&r, devnull);
    if (devnull != stdout) fclose(devnull);
    qf_kv_report_free(&r);
    /* too few vectors everywhere: a capture failure, not a crash */
    int64_t small[2] = {10, 10};
    qf_kv_capture_view tiny = {L, H, dim, k, v, small, small};
    CHECK(qf_kv_analyze(&tiny, &p, &r, &e) == QF_ERR_CAPTURE_FAILED);
    qf_kv_rd_table empty = {0};
    CHECK(qf_kv_rd_write_svg(&empty, path, &e) == QF_ERR_ARG);
    for (int i = 0; i < 4; i++) free(kv[i]);
    free(D);
}

int main(void) {
    RUN(omp_recovers_sparse_signals);
    RUN(ksvd_error_never_increases);
    RUN(learning_is_deterministic_and_thread_independent);
    RUN(code_packing_matches_rounded_decode);
    RUN(measurement_uses_the_engine_encoder);
    RUN(omp_with_gram_table_is_bit_identical);
    RUN(error_bounded_omp_and_packed_indices);
    RUN(int8_round_trip_bounds);
    RUN(hadamard_is_orthonormal);
    RUN(relative_errors_are_in_unit_interval);
    RUN(analysis_end_to_end);
    return test_summary();
}
