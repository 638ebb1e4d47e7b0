/* bench_kv_ec.c: the kv-int8 "ec" row decoder on one thread, ns per row: rows of n Gaussian
 * elements (a rotated K/V row's shape) through the encoder, then decoded by the one-row
 * decoder, the four-row one (kv_cache.c's gather before the 16-row kernel) and the 16-row one
 * and the 16-row one on 32 rows (two groups of 16 lanes interleaved; AVX-512 lanes where
 * the CPU has them: the line says which), alternating, best of the rounds.
 * Every version's floats must equal the reference's (checked once; exit 1 if not).
 *   build/bench/bench_kv_ec [n = 128] [rows = 4096] [rounds = 7] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_codes.h"
#include "util/util.h"

static uint64_t rs = 11;
static double gauss(void) {
    double u = ((qf_xorshift64s(&rs) >> 11) + 1) * 0x1.0p-53, v = (qf_xorshift64s(&rs) >> 11) * 0x1.0p-53;
    return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

/* all rows (n bytes each, contiguous) decoded into y (n floats each) by version k: 0 one row,
 * 1 four rows, 2 sixteen rows, 3 thirty-two rows */
static void decode_all(int k, const uint8_t *q, int n, int rows, float *y) {
    for (int p = 0; p < rows;) {
        const int nr = k == 3 && p + 32 <= rows ? 32 : k >= 2 && p + 16 <= rows ? 16 : 0;
        if (nr) {
            float *o[32];
            for (int r = 0; r < nr; r++) o[r] = y + (size_t)(p + r) * n;
            qf_kv_int8_ec_dequantize16(q + (size_t)p * n, (size_t)n, n, nr, o, n);
            p += nr;
        } else if (k >= 1 && p + 4 <= rows) {
            const uint8_t *r4[4] = {q + (size_t)p * n, q + (size_t)(p + 1) * n, q + (size_t)(p + 2) * n, q + (size_t)(p + 3) * n};
            float *const o[4] = {y + (size_t)p * n, y + (size_t)(p + 1) * n, y + (size_t)(p + 2) * n, y + (size_t)(p + 3) * n};
            qf_kv_int8_ec_dequantize4(r4, n, o, n);
            p += 4;
        } else {
            qf_kv_int8_ec_dequantize(q + (size_t)p * n, n, y + (size_t)p * n, n);
            p++;
        }
    }
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 128, rows = argc > 2 ? atoi(argv[2]) : 4096,
              rounds = argc > 3 ? atoi(argv[3]) : 7;
    if (n < 16 || n > 1024 || n % 8 || rows < 16 || rounds < 1) {
        fprintf(stderr, "usage: %s [n: a multiple of 8 in 16..1024] [rows >= 16] [rounds >= 1]\n", argv[0]);
        return 2;
    }
    uint8_t *q = malloc((size_t)rows * n);
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)rows * n),
          *ref = malloc(sizeof(float) * (size_t)rows * n);
    if (!q || !x || !y || !ref) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < n; i++) x[i] = (float)gauss();
        qf_kv_int8_ec_quantize(x, q + (size_t)r * n, n);
        qf_kv_int8_ec_dequantize_ref(q + (size_t)r * n, n, ref + (size_t)r * n, n);
    }
    static const char *names[4] = {"one row", "four rows", "sixteen rows", "32 rows"};
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int k = 0; k < 4; k++) {
        memset(y, 0, sizeof(float) * (size_t)rows * n);
        decode_all(k, q, n, rows, y);
        if (memcmp(y, ref, sizeof(float) * (size_t)rows * n)) {
            fprintf(stderr, "%s: differs from the reference\n", names[k]);
            return 1;
        }
    }
    for (int it = 0; it < rounds; it++)
        for (int k = 0; k < 4; k++) {
            double t0 = qf_now_sec();
            decode_all(k, q, n, rows, y);
            double dt = (qf_now_sec() - t0) * 1e9 / rows;
            if (dt < best[k]) best[k] = dt;
        }
    printf("ec decode, n = %d, %d Gaussian rows, 1 thread, best of %d (16-row kernel: %s)\n", n, rows, rounds,
           qf_kv_int8_ec16_fast() ? "AVX-512" : "off, four-row fallback");
    for (int k = 0; k < 4; k++)
        printf("  %-13s %8.1f ns/row  %6.2f ns/element  %5.2fx four rows\n", names[k], best[k], best[k] / n,
               best[1] / best[k]);
    free(q), free(x), free(y), free(ref);
    return 0;
}
