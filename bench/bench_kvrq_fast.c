/* bench_kvrq_fast.c: the kernels of kv-rq's fast route on the CPU (forward.c's decode step over
 * a kv-rq cache, engine.h "kv-rq in the coefficient domain") at the Llama-3-8B head shape
 * (head_dim 128, 8 kv heads, 4 query heads each), one kv head and T cached positions, each
 * against what the route ran before, in the same run, on one thread:
 *   K rows from their coefficients  mean + Y T, Y [T][m]:  qf_gemm_nn_f32 vs memcpy + OpenBLAS sgemm
 *   V coefficient sums, one query   S [1][T] Yv [T][m]:    qf_gemm_nn_f32 vs OpenBLAS sgemm
 *   K's coefficient sums, one query S [1][T] Yk [T][kdim]: qf_gemm_nn_f32 vs OpenBLAS sgemm
 *   scores, one query               K [T][128] . q:        qf_vec_rows_dot vs OpenBLAS sgemm (NT)
 *   codes to coefficients           T rows of m codes:     qf_bits_lookup vs its scalar oracle
 *   RoPE on one K row               64 pairs:              qf_rope_pairs vs its scalar oracle
 * Random data; m = 90 coefficients a head (2.5 bits: about 70% of 128 coordinates coded, widths
 * 1-6) and kdim = 8 x 90. Prints the best of `rounds` for each and the ratio (> 1: the new kernel
 * is faster). The outputs are compared too: bit for bit where the contracts say so, within
 * rounding against OpenBLAS.
 *
 *   build/bench/bench_kvrq_fast [positions] [rounds]   (default 2048, 20) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/blas.h"
#include "kernels/vecmath.h"
#include "util/util.h"

enum { HD = 128, NKV = 8, M = 90, KD = NKV * M };

static uint64_t rs = 11;
static float frand(void) { return (float)(qf_rand_unit(&rs) * 2.0 - 1.0); }

static double now(void) { return qf_now_sec(); }

static void report(const char *what, double t_old, double t_new, double err) {
    printf("%-34s before %9.2f us   now %9.2f us   %5.2fx   max |diff| %.2e\n", what, t_old * 1e6, t_new * 1e6,
           t_old / t_new, err);
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 2048, rounds = argc > 2 ? atoi(argv[2]) : 20;
    if (T < 1 || rounds < 1) {
        fprintf(stderr, "usage: %s [positions >= 1] [rounds >= 1]\n", argv[0]);
        return 2;
    }
    if (!qf_gemm_nn_f32_fast()) printf("(no AVX-512 here: the new kernels run their scalar oracles)\n");
    float *Y = malloc(sizeof(float) * (size_t)T * KD), *Tm = malloc(sizeof(float) * M * HD), mean[HD];
    float *C0 = malloc(sizeof(float) * (size_t)T * HD), *C1 = malloc(sizeof(float) * (size_t)T * HD);
    float *S = malloc(sizeof(float) * (size_t)T), *K = malloc(sizeof(float) * (size_t)T * HD), q[HD];
    float o0[KD], o1[KD];
    if (!Y || !Tm || !C0 || !C1 || !S || !K) return 1;
    for (size_t i = 0; i < (size_t)T * KD; i++) Y[i] = frand();
    for (int i = 0; i < M * HD; i++) Tm[i] = frand() * 0.1f;
    for (int i = 0; i < HD; i++) mean[i] = frand(), q[i] = frand();
    for (int t = 0; t < T; t++) S[t] = (float)qf_rand_unit(&rs) / (float)T;
    for (size_t i = 0; i < (size_t)T * HD; i++) K[i] = frand();
    double b0 = 1e30, b1 = 1e30, t0;

    /* K rows of one head from the K coefficient rows (stride KD) */
    for (int r = 0; r < rounds; r++) {
        t0 = now();
        for (int p = 0; p < T; p++) memcpy(C0 + (size_t)p * HD, mean, sizeof mean);
        qf_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HD, M, 1.0f, Y, KD, Tm, HD, 1.0f, C0, HD);
        b0 = fmin(b0, now() - t0);
        t0 = now();
        qf_gemm_nn_f32(T, M, HD, Y, KD, Tm, HD, mean, C1, HD);
        b1 = fmin(b1, now() - t0);
    }
    report("K rows: mean + Y T", b0, b1, maxdiff(C0, C1, (size_t)T * HD));

    /* one query's V coefficient sums (Yv: stride HD, m used) and K's (stride KD, all heads) */
    const struct {
        const char *name;
        int w;
        size_t ld;
    } sums[2] = {{"V sums: S Yv (1 query)", M, HD}, {"K sums: S Yk (1 query, 8 heads)", KD, KD}};
    for (int k = 0; k < 2; k++) {
        b0 = b1 = 1e30;
        for (int r = 0; r < rounds; r++) {
            t0 = now();
            qf_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, sums[k].w, T, 1.0f, S, T, Y, (int)sums[k].ld, 0.0f, o0,
                     sums[k].w);
            b0 = fmin(b0, now() - t0);
            t0 = now();
            qf_gemm_nn_f32(1, T, sums[k].w, S, (size_t)T, Y, sums[k].ld, NULL, o1, (size_t)sums[k].w);
            b1 = fmin(b1, now() - t0);
        }
        report(sums[k].name, b0, b1, maxdiff(o0, o1, (size_t)sums[k].w));
    }

    /* one query's scores against T keys */
    b0 = b1 = 1e30;
    for (int r = 0; r < rounds; r++) {
        t0 = now();
        qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, T, HD, 0.088f, q, HD, K, HD, 0.0f, C0, T);
        b0 = fmin(b0, now() - t0);
        t0 = now();
        qf_vec_rows_dot(K, HD, HD, q, T, C1);
        for (int t = 0; t < T; t++) C1[t] *= 0.088f;
        b1 = fmin(b1, now() - t0);
    }
    report("scores: K . q (1 query)", b0, b1, maxdiff(C0, C1, (size_t)T));

    /* codes to coefficients: M codes of widths 1..6 a row, T rows */
    static int32_t by[M], sh[M], mk[M], to[M];
    static float tab[HD * 64];
    unsigned bit = 0, nt = 0;
    for (int k = 0; k < M; k++) {
        int w = k < 10 ? 6 - k / 2 : 1 + k % 3;
        by[k] = (int32_t)(bit >> 3), sh[k] = (int32_t)(bit & 7), mk[k] = (1 << w) - 1, to[k] = (int32_t)nt;
        nt += 1u << w, bit += (unsigned)w;
    }
    for (int i = 0; i < HD * 64; i++) tab[i] = frand();
    static float sctab[256];
    for (int c = 0; c < 256; c++) sctab[c] = (float)c / 128.0f;
    const size_t rb = (bit + 7) / 8 + 1;
    uint8_t *rows = malloc(rb * (size_t)T + 8);
    if (!rows) return 1;
    for (size_t i = 0; i < rb * (size_t)T + 8; i++) rows[i] = (uint8_t)(qf_rand_unit(&rs) * 256);
    b0 = b1 = 1e30;
    for (int r = 0; r < rounds; r++) {
        t0 = now();
        qf_bits_lookup_ref(rows, rb, T, 1, sctab, M, by, sh, mk, to, tab, C0, M);
        b0 = fmin(b0, now() - t0);
        t0 = now();
        qf_bits_lookup(rows, rb, T, 1, sctab, M, by, sh, mk, to, tab, C1, M);
        b1 = fmin(b1, now() - t0);
    }
    report("codes: T rows of 90", b0, b1, maxdiff(C0, C1, (size_t)T * M));

    /* RoPE on T rows of one head */
    float cs[HD / 2], sn[HD / 2];
    for (int i = 0; i < HD / 2; i++) cs[i] = cosf((float)i), sn[i] = sinf((float)i);
    memcpy(C0, K, sizeof(float) * (size_t)T * HD), memcpy(C1, K, sizeof(float) * (size_t)T * HD);
    b0 = b1 = 1e30;
    for (int r = 0; r < rounds; r++) { /* rotating again each round: the same work */
        t0 = now();
        for (int p = 0; p < T; p++) qf_rope_pairs_ref(C0 + (size_t)p * HD, cs, sn, HD / 2);
        b0 = fmin(b0, now() - t0);
        t0 = now();
        for (int p = 0; p < T; p++) qf_rope_pairs(C1 + (size_t)p * HD, cs, sn, HD / 2);
        b1 = fmin(b1, now() - t0);
    }
    report("RoPE: T rows of 64 pairs", b0, b1, maxdiff(C0, C1, (size_t)T * HD));
    free(Y), free(Tm), free(C0), free(C1), free(S), free(K), free(rows);
    return 0;
}
