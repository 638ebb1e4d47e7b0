/* bench_dict.c: kv-dict throughput (head_dim 64, or --dim): OMP encoding (vectors/s) against a
 * textbook OMP measured in the same run, k-SVD learning, each at 1 and 2 threads, and the
 * learner's encoder with its Cholesky dots read from the dictionary's table (qf_kv_omp_gd)
 * against recomputing them per vector (qf_kv_omp_ex), one thread, the codes compared.
 * `--analysis` also times the whole go/no-go + sweep on a demo-model-sized synthetic
 * capture (6 layers x K/V x 6144 vectors).
 *
 *   build/bench/bench_dict [--n 20000] [--atoms 256] [--s 8] [--iters 3] [--dim 64] [--analysis]
 *   (the 8B heads: --dim 128)
 *
 * The data are synthetic KV-like vectors: a few strong directions plus a decaying
 * Gaussian spectrum, so OMP does the same work it does on real captures. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kv_codes.h"
#include "qforge/kvlearn.h"
#include "util/util.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rs = 42;
static double nrand(void) {
    double u = 1.0 - qf_rand_unit(&rs); /* (0, 1]: log(u) is finite */
    double v = qf_rand_unit(&rs);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static float *kv_like(int64_t n, int dim) {
    float *X = malloc(sizeof(float) * (size_t)n * dim);
    float *mix = malloc(sizeof(float) * (size_t)dim * dim);
    for (int i = 0; i < dim * dim; i++) mix[i] = (float)(nrand() / sqrt(dim));
    float *z = malloc(sizeof(float) * (size_t)dim);
    for (int64_t i = 0; i < n; i++) {
        for (int t = 0; t < dim; t++) z[t] = (float)(nrand() * exp(-t / 12.0));
        z[i % 3] += 4.0f; /* outlier channels, as post-RoPE K has */
        for (int t = 0; t < dim; t++) {
            double acc = 0;
            for (int u = 0; u < dim; u++) acc += (double)mix[t * dim + u] * z[u];
            X[(size_t)i * dim + t] = (float)acc;
        }
    }
    free(mix);
    free(z);
    return X;
}

/* Textbook OMP: correlations D r from scratch every step, normal equations by a fresh
 * Cholesky, explicit residual. The baseline batch OMP is measured against. */
static void omp_naive(const qf_kv_dict *d, const float *x, int s, int *idx, double *gam) {
    const int A = d->n_atoms, dim = d->head_dim;
    double r[256], G[64 * 64], L[64 * 64], c[64], y[64];
    for (int t = 0; t < dim; t++) r[t] = x[t];
    int k;
    for (k = 0; k < s; k++) {
        int best = -1;
        double bv = -1;
        for (int a = 0; a < A; a++) {
            double acc = 0;
            for (int t = 0; t < dim; t++) acc += d->atoms[(size_t)a * dim + t] * r[t];
            if (fabs(acc) > bv) bv = fabs(acc), best = a;
        }
        idx[k] = best;
        int m = k + 1;
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < m; j++) {
                double acc = 0;
                for (int t = 0; t < dim; t++)
                    acc += d->atoms[(size_t)idx[i] * dim + t] * d->atoms[(size_t)idx[j] * dim + t];
                G[i * m + j] = acc;
            }
            double acc = 0;
            for (int t = 0; t < dim; t++) acc += d->atoms[(size_t)idx[i] * dim + t] * x[t];
            c[i] = acc;
        }
        for (int i = 0; i < m; i++)
            for (int j = 0; j <= i; j++) {
                double v = G[i * m + j];
                for (int q = 0; q < j; q++) v -= L[i * m + q] * L[j * m + q];
                L[i * m + j] = i == j ? sqrt(fmax(v, 1e-20)) : v / L[j * m + j];
            }
        for (int i = 0; i < m; i++) {
            double v = c[i];
            for (int q = 0; q < i; q++) v -= L[i * m + q] * y[q];
            y[i] = v / L[i * m + i];
        }
        for (int i = m - 1; i >= 0; i--) {
            double v = y[i];
            for (int q = i + 1; q < m; q++) v -= L[q * m + i] * gam[q];
            gam[i] = v / L[i * m + i];
        }
        for (int t = 0; t < dim; t++) {
            double acc = x[t];
            for (int i = 0; i < m; i++) acc -= gam[i] * d->atoms[(size_t)idx[i] * dim + t];
            r[t] = acc;
        }
    }
}

int main(int argc, char **argv) {
    int64_t n = 20000;
    int A = 256, s = 8, iters = 3, dim = 64;
    int analysis = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--atoms") && i + 1 < argc) A = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--s") && i + 1 < argc) s = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc) dim = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--analysis")) analysis = 1;
        else {
            fprintf(stderr, "usage: %s [--n N] [--atoms A] [--s S] [--iters I] [--dim D] [--analysis]\n",
                    argv[0]);
            return 1;
        }
    }
    if (n < A || s < 1 || s > 64 || A < s || A > QF_KV_MAX_ATOMS || dim < s || dim > 256) {
        fprintf(stderr, "bench_dict: need atoms <= n, 1 <= s <= 64, s <= atoms <= %d, s <= dim <= 256\n",
                QF_KV_MAX_ATOMS);
        return 1;
    }
    float *X = kv_like(n, dim);
    qf_error e;
    printf("bench_dict: %lld vectors, head_dim %d, %d atoms, s=%d\n", (long long)n, dim, A, s);

    /* learning */
    qf_kv_dict d[2];
    double learn_t[2];
    for (int th = 1; th <= 2; th++) {
        qf_kv_dict_params p;
        qf_kv_dict_params_default(&p);
        p.n_atoms = A, p.sparsity = s, p.iters = iters, p.n_threads = th;
        double t0 = now();
        if (qf_kv_dict_learn(X, n, dim, &p, &d[th - 1], &e) != QF_OK) {
            fprintf(stderr, "learn: %s\n", e.msg);
            return 1;
        }
        learn_t[th - 1] = now() - t0;
        printf("k-SVD learn, %d iters, %d thread%s: %7.2f s  %9.0f vector-iterations/s\n", iters,
               th, th > 1 ? "s" : " ", learn_t[th - 1], (double)n * (iters + 1) / learn_t[th - 1]);
    }
    printf("  2 threads vs 1: x%.2f; identical dictionaries: %s\n", learn_t[0] / learn_t[1],
           memcmp(d[0].atoms, d[1].atoms, sizeof(float) * (size_t)A * dim) ? "NO" : "yes");

    /* encoding: the textbook baseline on a slice, then batch OMP */
    int64_t nb = n < 4000 ? n : 4000;
    int *ni = malloc(sizeof(int) * (size_t)s);
    double *ng = malloc(sizeof(double) * (size_t)s);
    double t0 = now();
    for (int64_t i = 0; i < nb; i++) omp_naive(&d[0], X + (size_t)i * dim, s, ni, ng);
    double base = nb / (now() - t0);
    printf("OMP encode, textbook (baseline), 1 thread: %9.0f vectors/s\n", base);
    uint16_t *idx = malloc(sizeof(uint16_t) * (size_t)n * s);
    float *coef = malloc(sizeof(float) * (size_t)n * s);
    double enc[2];
    for (int th = 1; th <= 2; th++) {
        t0 = now();
        if (qf_kv_dict_encode(&d[0], X, n, s, th, idx, coef, &e) != QF_OK) {
            fprintf(stderr, "encode: %s\n", e.msg);
            return 1;
        }
        enc[th - 1] = n / (now() - t0);
        printf("OMP encode, batch + Cholesky, %d thread%s: %9.0f vectors/s  x%.2f vs baseline\n",
               th, th > 1 ? "s" : " ", enc[th - 1], enc[th - 1] / base);
    }
    printf("  2 threads vs 1: x%.2f\n", enc[1] / enc[0]);
    /* the learner's encoder: correlations passed in (as its sgemm passes them), the Cholesky dots
     * recomputed per vector against read from qf_kv_gram_d's table */
    {
        double *gd = malloc(sizeof(double) * (size_t)A * A), t_gd[2] = {0, 0};
        float *al = malloc(sizeof(float) * (size_t)A), c1[64], c2[64];
        uint16_t i1[64], i2[64];
        void *scratch = malloc(qf_kv_omp_scratch_bytes(A, s));
        t0 = now();
        qf_kv_gram_d(&d[0], gd);
        double t_table = now() - t0;
        int64_t ne = n < 8000 ? n : 8000, same = 0;
        for (int64_t i = 0; i < ne; i++) {
            const float *x = X + (size_t)i * dim;
            for (int a = 0; a < A; a++) {
                float acc = 0;
                for (int t = 0; t < dim; t++) acc += d[0].atoms[(size_t)a * dim + t] * x[t];
                al[a] = acc;
            }
            double ta = now();
            int k1 = qf_kv_omp_ex(&d[0], x, al, s, 0, scratch, i1, c1);
            double tb = now();
            int k2 = qf_kv_omp_gd(&d[0], gd, x, al, s, 0, scratch, i2, c2);
            t_gd[0] += tb - ta, t_gd[1] += now() - tb;
            same += k1 == k2 && !memcmp(i1, i2, sizeof(uint16_t) * (size_t)s) && !memcmp(c1, c2, sizeof(float) * (size_t)s);
        }
        printf("learner's OMP (correlations given), 1 thread: dots recomputed %9.0f vectors/s, from the table %9.0f "
               "vectors/s  x%.2f (table %.1f ms a dictionary); identical codes: %lld of %lld\n",
               ne / t_gd[0], ne / t_gd[1], t_gd[0] / t_gd[1], t_table * 1e3, (long long)same, (long long)ne);
        free(gd), free(al), free(scratch);
    }
    float *rec = malloc(sizeof(float) * (size_t)n * dim);
    qf_kv_dict_decode(&d[0], idx, coef, s, n, rec);
    printf("  training relative MSE: %.4e (f32 coefficients)\n", qf_rel_mse(X, rec, n * dim));

    if (analysis) {
        enum { L = 6, NV = 6144 };
        const float *k[L], *v[L];
        float *bufs[2 * L];
        int64_t cnt[L];
        for (int l = 0; l < L; l++) {
            bufs[2 * l] = kv_like(NV, dim);
            bufs[2 * l + 1] = kv_like(NV, dim);
            k[l] = bufs[2 * l];
            v[l] = bufs[2 * l + 1];
            cnt[l] = NV;
        }
        qf_kv_capture_view cap = {L, 2, dim, k, v, cnt, cnt};
        qf_kv_analysis_params p;
        qf_kv_analysis_params_default(&p);
        p.n_threads = 2;
        int pts[][2] = {{64, 4}, {256, 4}, {256, 8}, {512, 8}};
        p.n_rd = 4;
        for (int j = 0; j < 4; j++) p.rd_atoms[j] = pts[j][0], p.rd_sparsity[j] = pts[j][1];
        qf_kv_report r;
        if (qf_kv_analyze(&cap, &p, &r, &e) != QF_OK) {
            fprintf(stderr, "analysis: %s\n", e.msg);
            return 1;
        }
        qf_kv_report_print(&r, stdout);
        qf_kv_report_free(&r);
        for (int i = 0; i < 2 * L; i++) free(bufs[i]);
    }
    qf_kv_dict_free(&d[0]);
    qf_kv_dict_free(&d[1]);
    free(X), free(ni), free(ng), free(idx), free(coef), free(rec);
    return 0;
}
