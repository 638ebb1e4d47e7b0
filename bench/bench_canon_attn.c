/* bench_canon_attn.c: the canonical attention kernels (kernels/canon_cpu.h) on one 64-query block
 * of a head against T cached keys (head_dim 128: the prefill's ATT_QBLOCK at the end of a -c 2048
 * chunk), the oracle, the AVX2 kernels and the AVX-512 kernels in the same run, on one thread;
 * every output must be equal bit for bit (each one the oracle's fmaf chain).
 *   scores: S = Q K^T * scale, [64][T]
 *   pv:     O = P V over each query's causal keys, [64][128], with 4 sinks and a 24-key window
 *           read from the exact rows (kv-rq's)
 *
 *   build/bench/bench_canon_attn [T] [rounds]   (defaults 2048, 20) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/canon_cpu.h"
#include "kernels/gemm.h"
#include "qforge/quant.h"
#include "util/util.h"

enum { NQ = 64, HD = 128 };

static double best_of(double best, double t) { return t < best ? t : best; }

int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 2048, rounds = argc > 2 ? atoi(argv[2]) : 20;
    if (T < NQ || rounds < 1) {
        fprintf(stderr, "usage: %s [T >= %d] [rounds >= 1]\n", argv[0], NQ);
        return 2;
    }
    const bool avx2 = qf_quant_has_avx2(), avx512 = avx2 && qf_gemm_isa_get() == QF_GEMM_ISA_AVX512;
    float *Q = malloc(sizeof(float) * NQ * HD), *K = malloc(sizeof(float) * (size_t)T * HD);
    float *V = malloc(sizeof(float) * (size_t)T * HD), *EV = malloc(sizeof(float) * (size_t)T * HD);
    float *S[3], *O[3], *scr = malloc(sizeof(float) * QF_CANON_SCRATCH(HD));
    for (int k = 0; k < 3; k++) S[k] = malloc(sizeof(float) * NQ * (size_t)T), O[k] = malloc(sizeof(float) * NQ * HD);
    if (!Q || !K || !V || !EV || !scr || !S[0] || !S[1] || !S[2] || !O[0] || !O[1] || !O[2]) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    uint64_t rs = 7;
    for (int i = 0; i < NQ * HD; i++) Q[i] = (float)(qf_rand_unit(&rs) - 0.5);
    for (size_t i = 0; i < (size_t)T * HD; i++)
        K[i] = (float)(qf_rand_unit(&rs) - 0.5), V[i] = (float)(qf_rand_unit(&rs) - 0.5), EV[i] = V[i] * 1.001f;
    const int cnt0 = T - NQ + 1; /* query i sits at position T - NQ + i and sees cnt0 + i keys */
    double ts[3] = {1e30, 1e30, 1e30}, tp[3] = {1e30, 1e30, 1e30};
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 3; k++) {
            if ((k == 1 && !avx2) || (k == 2 && !avx512)) continue;
            double t0 = qf_now_sec();
            if (k == 0) qf_canon_scores_ref(Q, HD, NQ, K, T, HD, 0.088f, S[0], T);
            else if (k == 1) qf_canon_scores_avx2(Q, HD, NQ, K, T, HD, 0.088f, S[1], T, scr);
            else qf_canon_scores_avx512(Q, HD, NQ, K, T, HD, 0.088f, S[2], T, scr);
            double t1 = qf_now_sec();
            for (int i = 0; i < NQ * T; i++) S[k][i] = 1.0f / (float)T; /* the same P for every kernel */
            double t2 = qf_now_sec();
            if (k == 0) qf_canon_pv_ref(S[0], T, NQ, cnt0, V, EV, 4, 24, HD, O[0], HD);
            else if (k == 1) qf_canon_pv_avx2(S[1], T, NQ, cnt0, V, EV, 4, 24, HD, O[1], HD);
            else qf_canon_pv_avx512(S[2], T, NQ, cnt0, V, EV, 4, 24, HD, O[2], HD);
            double t3 = qf_now_sec();
            ts[k] = best_of(ts[k], t1 - t0), tp[k] = best_of(tp[k], t3 - t2);
        }
    /* the scores themselves, compared once more (the loop above overwrote S with P) */
    int bad = 0;
    qf_canon_scores_ref(Q, HD, NQ, K, T, HD, 0.088f, S[0], T);
    for (int k = 1; k < 3; k++) {
        if ((k == 1 && !avx2) || (k == 2 && !avx512)) continue;
        if (k == 1) qf_canon_scores_avx2(Q, HD, NQ, K, T, HD, 0.088f, S[1], T, scr);
        else qf_canon_scores_avx512(Q, HD, NQ, K, T, HD, 0.088f, S[2], T, scr);
        bad += memcmp(S[0], S[k], sizeof(float) * NQ * (size_t)T) != 0;
        bad += memcmp(O[0], O[k], sizeof(float) * NQ * HD) != 0;
    }
    printf("canonical attention, one block of %d queries x %d keys, head_dim %d, one thread\n", NQ, T, HD);
    printf("%-8s %12s %12s %12s   %s\n", "", "oracle", "AVX2", "AVX-512", "AVX-512 / AVX2");
    printf("%-8s %9.1f us %9.1f us %9.1f us   %.2fx\n", "scores", ts[0] * 1e6, avx2 ? ts[1] * 1e6 : 0.0,
           avx512 ? ts[2] * 1e6 : 0.0, avx512 ? ts[1] / ts[2] : 0.0);
    printf("%-8s %9.1f us %9.1f us %9.1f us   %.2fx\n", "pv", tp[0] * 1e6, avx2 ? tp[1] * 1e6 : 0.0,
           avx512 ? tp[2] * 1e6 : 0.0, avx512 ? tp[1] / tp[2] : 0.0);
    printf("outputs equal to the oracle's: %s%s\n", bad ? "NO" : "yes",
           avx512 ? "" : avx2 ? " (no AVX-512 on this CPU)" : " (no AVX2 on this CPU)");
    for (int k = 0; k < 3; k++) free(S[k]), free(O[k]);
    free(Q), free(K), free(V), free(EV), free(scr);
    return bad ? 1 : 0;
}
