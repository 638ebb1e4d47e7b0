/* bench_gemm_f16.c: the f16 prefill GEMM (kernels/gemm.h, qf_gemm_f16_rows) at the Llama-3.2-1B
 * shapes, with 1 and 2 threads, split as forward.c's mm_worker splits it (tiles of TILE rows from
 * an atomic counter). Per shape: GFLOP/s of the whole call, and per thread its busy time and the
 * tiles it took, so load imbalance and the wait at the end of a call show up.
 *   build/bench/bench_gemm_f16 [--n 511] [--reps 3] [--tile 128] [--threads 2] [--guided MINU]
 * --guided MINU: chunks of tile rows while much is left, then shrinking to MINU x 32 rows (forward.c's
 * prefill split); without it, fixed tiles of --tile rows.
 * Random weights (f16 of uniform [-1, 1)); the numbers are not checked here (tests/test_quant.c
 * checks the kernel against its oracle). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "util/util.h"

static uint64_t rng = 88172645463325252ull;
static float rndf(void) { return (float)(qf_xorshift64s(&rng) >> 40) / 16777216.0f * 2.0f - 1.0f; }

typedef struct {
    const uint16_t *w;
    const float *x;
    float *y;
    int64_t K, N;
    int n, tile, minu; /* minu > 0: guided chunks (tile rows, shrinking to minu x 32 rows at the end) */
    float *scratch[8];
    _Atomic int64_t next;
    double busy[8];
    int tiles[8];
} job;

static void worker(void *arg, int ith, int nth) {
    job *j = arg;
    double t0 = qf_now_sec();
    int64_t ntiles = (j->N + j->tile - 1) / j->tile;
    int got = 0;
    if (j->minu > 0) { /* units of 32 rows; chunk = remaining / (2 nth), between minu and tile / 32 units */
        const int64_t U = (j->N + 31) / 32, tu = j->tile / 32;
        for (;;) {
            int64_t cur = atomic_load(&j->next), sz;
            do {
                if (cur >= U) goto done;
                sz = (U - cur) / (2 * nth);
                sz = sz > tu ? tu : sz < j->minu ? j->minu : sz;
                if (sz > U - cur) sz = U - cur;
            } while (!atomic_compare_exchange_weak(&j->next, &cur, cur + sz));
            int64_t r = cur * 32, re = (cur + sz) * 32 < j->N ? (cur + sz) * 32 : j->N;
            qf_gemm_f16_rows(j->w, (size_t)j->K * 2, j->K, r, re, j->x, j->n, j->y, j->N, j->scratch[ith]);
            got++;
        }
    }
    for (int64_t tl; (tl = atomic_fetch_add(&j->next, 1)) < ntiles; got++) {
        int64_t r = tl * j->tile, re = j->N - r < j->tile ? j->N : r + j->tile;
        qf_gemm_f16_rows(j->w, (size_t)j->K * 2, j->K, r, re, j->x, j->n, j->y, j->N, j->scratch[ith]);
    }
done:
    j->busy[ith] += qf_now_sec() - t0;
    j->tiles[ith] += got;
}

int main(int argc, char **argv) {
    int n = 511, reps = 3, tile = 128, maxthr = 2, minu = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n")) n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tile")) tile = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) maxthr = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--guided")) minu = atoi(argv[i + 1]);
    }
    if (!qf_gemm_f16_supported()) {
        fprintf(stderr, "bench_gemm_f16: no AVX-512 f16 kernel on this CPU\n");
        return 1;
    }
    if (maxthr < 1 || maxthr > 8) maxthr = 2;
    /* q / o, k / v, gate / up, down, and the head for the 256 scored rows */
    const struct { const char *name; int64_t N, K; int n; } shapes[] = {
        {"q,o 2048x2048", 2048, 2048, n}, {"k,v 512x2048", 512, 2048, n},    {"gate,up 8192x2048", 8192, 2048, n},
        {"down 2048x8192", 2048, 8192, n}, {"head 128256x2048", 128256, 2048, 256},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t N = shapes[s].N, K = shapes[s].K;
        const int nt = shapes[s].n;
        uint16_t *w = qf_malloc_aligned((size_t)N * K * 2);
        float *x = qf_malloc_aligned((size_t)nt * K * 4), *y = qf_malloc_aligned((size_t)nt * N * 4);
        for (int64_t i = 0; i < N * K; i++) w[i] = qf_f32_to_f16(rndf());
        for (int64_t i = 0; i < (int64_t)nt * K; i++) x[i] = rndf();
        memset(y, 0, (size_t)nt * N * 4);
        const double flop = 2.0 * (double)N * (double)K * nt;
        for (int thr = 1; thr <= maxthr; thr++) {
            qf_pool *p = qf_pool_create(thr);
            job j = {.w = w, .x = x, .y = y, .K = K, .N = N, .n = nt, .tile = tile, .minu = minu};
            for (int i = 0; i < thr; i++) j.scratch[i] = qf_malloc_aligned(qf_gemm_f16_scratch_bytes(tile));
            double best = 1e30, total = 0;
            for (int r = 0; r < reps; r++) {
                atomic_store(&j.next, 0);
                double t0 = qf_now_sec();
                qf_pool_run(p, worker, &j);
                double el = qf_now_sec() - t0;
                total += el;
                if (el < best) best = el;
            }
            printf("%-18s -t %d  best %7.2f ms  %6.1f GFLOP/s (mean %6.1f)", shapes[s].name, thr, best * 1e3,
                   flop / best / 1e9, flop * reps / total / 1e9);
            for (int i = 0; i < thr; i++)
                printf("  [t%d busy %5.1f%% tiles %d]", i, 100 * j.busy[i] / total, j.tiles[i] / reps);
            printf("\n");
            for (int i = 0; i < thr; i++) free(j.scratch[i]);
            qf_pool_free(p);
        }
        free(w), free(x), free(y);
    }
    return 0;
}
