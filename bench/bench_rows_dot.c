/* bench_rows_dot.c: kv-rq's V predictor products (qf_vec_rows_dot, kernels/vecmath.h) at the
 * Llama-3-8B shape, the oracle (one in-order f32 chain per output, what kv_cache.c ran before
 * session 26) against the dispatched kernel (AVX2: eight outputs in the lanes) in the same run,
 * on one thread; the outputs must be equal bit for bit.
 *   write: one token's V prediction, P [1024][1024] times the token's decoded K [1024]
 *   read:  one kv head's share, 128 rows of P (stride 1024) times one K head [128]
 * and qf_vec_rows_dot_f64 (format 3's transform, one 128 x 128 head, double sums), then format
 * 3's decoder step, qf_vec_cols_axpy (x += decT^T y over one 128 x 128 head, a quarter of y's
 * coordinates dropped as low rates drop them), and the encoders' level search, qf_kv_rq_nearest
 * (branch-free) against its binary-search oracle over 4-level codebooks, random values.
 *
 *   build/bench/bench_rows_dot [rounds]   (default 200) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_rq.h"
#include "kernels/vecmath.h"
#include "util/util.h"

enum { HD = 1024, D = 128 };

typedef void (*rows_dot_fn)(const float *, size_t, int, const float *, int, float *);

static double time_it(rows_dot_fn f, const float *P, int n, const float *x, int m, float *y, int rounds) {
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = qf_now_sec();
        for (int k = 0; k < 8; k++) f(P, HD, n, x, m, y);
        double t = (qf_now_sec() - t0) / 8;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    if (rounds < 1) {
        fprintf(stderr, "usage: %s [rounds >= 1]\n", argv[0]);
        return 2;
    }
    float *P = malloc(sizeof(float) * HD * HD), *x = malloc(sizeof(float) * HD), *y0 = malloc(sizeof(float) * HD),
          *y1 = malloc(sizeof(float) * HD);
    if (!P || !x || !y0 || !y1) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    uint64_t rs = 5;
    for (size_t i = 0; i < (size_t)HD * HD; i++) P[i] = (float)(qf_rand_unit(&rs) - 0.5);
    for (int i = 0; i < HD; i++) x[i] = (float)(qf_rand_unit(&rs) - 0.5);
    static const struct { const char *name; int n, m; } cases[] = {{"write (1024 x 1024)", HD, HD}, {"read (128 x 128, stride 1024)", D, D}};
    int bad = 0;
    for (int c = 0; c < 2; c++) {
        int n = cases[c].n, m = cases[c].m;
        double tr = time_it(qf_vec_rows_dot_ref, P, n, x, m, y0, rounds);
        double tf = time_it(qf_vec_rows_dot, P, n, x, m, y1, rounds);
        bool eq = memcmp(y0, y1, sizeof(float) * (size_t)m) == 0;
        bad += !eq;
        printf("%-30s oracle %8.2f us, kernel %8.2f us: %.2fx; equal: %s\n", cases[c].name, tr * 1e6, tf * 1e6, tr / tf,
               eq ? "yes" : "NO");
    }
    /* format 3's transform: one 128 x 128 head, double sums (qf_kv_rq_klt_matvec) */
    double *z0 = malloc(sizeof(double) * D), *z1 = malloc(sizeof(double) * D), b0 = 1e30, b1 = 1e30;
    for (int r = 0; r < rounds && z0 && z1; r++) {
        double t0 = qf_now_sec();
        for (int k = 0; k < 64; k++) qf_vec_rows_dot_f64_ref(P, D, D, x, D, z0);
        double t1 = qf_now_sec();
        for (int k = 0; k < 64; k++) qf_vec_rows_dot_f64(P, D, D, x, D, z1);
        double t2 = qf_now_sec();
        b0 = (t1 - t0) / 64 < b0 ? (t1 - t0) / 64 : b0, b1 = (t2 - t1) / 64 < b1 ? (t2 - t1) / 64 : b1;
    }
    bool eq = z0 && z1 && memcmp(z0, z1, sizeof(double) * D) == 0;
    bad += !eq;
    printf("%-30s oracle %8.2f us, kernel %8.2f us: %.2fx; equal: %s\n", "transform (128 x 128, double)", b0 * 1e6,
           b1 * 1e6, b0 / b1, eq ? "yes" : "NO");
    free(z0), free(z1);
    /* format 3's decoder step: acc = mean + sum_j decT[j] y_j, y_j = 0 for every fourth j */
    {
        float yy[D], a0[D], a1[D];
        for (int j = 0; j < D; j++) yy[j] = j % 4 == 3 ? 0.0f : x[j];
        double c0 = 1e30, c1 = 1e30;
        for (int r = 0; r < rounds; r++) {
            double t0 = qf_now_sec();
            for (int k = 0; k < 64; k++) memcpy(a0, x, sizeof a0), qf_vec_cols_axpy_ref(P, D, D, yy, D, a0);
            double t1 = qf_now_sec();
            for (int k = 0; k < 64; k++) memcpy(a1, x, sizeof a1), qf_vec_cols_axpy(P, D, D, yy, D, a1);
            double t2 = qf_now_sec();
            c0 = (t1 - t0) / 64 < c0 ? (t1 - t0) / 64 : c0, c1 = (t2 - t1) / 64 < c1 ? (t2 - t1) / 64 : c1;
        }
        bool eqc = memcmp(a0, a1, sizeof a0) == 0;
        bad += !eqc;
        printf("%-30s oracle %8.2f us, kernel %8.2f us: %.2fx; equal: %s\n", "decode (128 x 128, 3/4 of y)", c0 * 1e6,
               c1 * 1e6, c0 / c1, eqc ? "yes" : "NO");
    }
    /* the level search: 4 levels (2-bit codes), HD random values a round */
    {
        static const float lv[4] = {-1.5f, -0.45f, 0.45f, 1.5f};
        double n0 = 1e30, n1 = 1e30;
        long s0 = 0, s1 = 0;
        for (int r = 0; r < rounds; r++) {
            double t0 = qf_now_sec();
            for (int i = 0; i < HD; i++) s0 += qf_kv_rq_nearest_ref(lv, 4, 3 * x[i]);
            double t1 = qf_now_sec();
            for (int i = 0; i < HD; i++) s1 += qf_kv_rq_nearest(lv, 4, 3 * x[i]);
            double t2 = qf_now_sec();
            n0 = (t1 - t0) < n0 ? (t1 - t0) : n0, n1 = (t2 - t1) < n1 ? (t2 - t1) : n1;
        }
        bad += s0 != s1;
        printf("%-30s oracle %8.2f us, kernel %8.2f us: %.2fx; equal: %s\n", "nearest level (1024 values)", n0 * 1e6,
               n1 * 1e6, n0 / n1, s0 == s1 ? "yes" : "NO");
    }
    free(P), free(x), free(y0), free(y1);
    return bad ? 1 : 0;
}
