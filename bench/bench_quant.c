/* bench_quant.c: throughput of the block-format kernels, scalar oracle vs AVX2, per type.
 * Reports GB/s of weight bytes read for dequantize_row and vec_dot over a matrix of rows of
 * n = 4096 elements, both versions measured in the same run, and for the types with a decode
 * matvec kernel (kernels/matvec.h) that kernel over the same rows, with its ratio to the AVX2
 * vec_dot (the per-row route it replaces). --rows 512 keeps the matrix in cache; --rows 32768
 * (100+ MB) reads it from memory, as decode does.
 *   build/bench/bench_quant [--n 4096] [--rows 512] [--time 0.1]   (seconds per measurement) */
#include "kernels/matvec.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant_impl.h"
#include "qforge/quant.h"
#include "util/util.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { return (uint32_t)(qf_xorshift64s(&rng) >> 32); }
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

/* Weights of type t: quantized from random floats where we have a quantizer, otherwise
 * random bytes with every scale made a sane half. */
static void make_weights(qf_type t, uint8_t *w, int64_t n, int64_t rows, float *tmp) {
    const size_t rb = qf_row_bytes(t, n);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = w + r * rb;
        for (int64_t i = 0; i < n; i++) tmp[i] = rndf();
        if (qf_quantize_row_ref(t, tmp, row, n)) continue;
        for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)rnd();
        const uint16_t d = qf_f32_to_f16(0.01f);
        for (int64_t b = 0; b < n / QK_K; b++) {
            if (t == QF_TYPE_Q4_K) ((block_q4_K *)row)[b].d = ((block_q4_K *)row)[b].dmin = d;
            if (t == QF_TYPE_Q5_K) ((block_q5_K *)row)[b].d = ((block_q5_K *)row)[b].dmin = d;
            if (t == QF_TYPE_Q6_K) ((block_q6_K *)row)[b].d = d;
        }
    }
}

static volatile float sink;

/* GB/s of weights through dequantize (what = 0), vec_dot (what = 1) or the decode matvec over all
 * rows at once (what = 2: x is then qf_matvec_prepare's activation, out has rows floats),
 * repeating over all rows until `budget` seconds have passed. */
static double measure(int what, qf_type t, const uint8_t *w, const void *x, float *out, int64_t n,
                      int64_t rows, double budget) {
    const size_t rb = qf_row_bytes(t, n);
    int64_t done = 0;
    double t0 = qf_now_sec(), el;
    float acc = 0;
    do {
        if (what == 2) {
            qf_matvec_rows(t, w, rb, n, 0, rows, x, out);
            acc += out[0];
        }
        for (int64_t r = 0; r < rows && what < 2; r++) {
            if (what == 0) {
                qf_dequantize_row(t, w + r * rb, out, n);
                acc += out[r % n];
            } else {
                acc += qf_vec_dot(t, n, w + r * rb, x);
            }
        }
        done += rows;
        el = qf_now_sec() - t0;
    } while (el < budget);
    sink = acc;
    return (double)done * (double)rb / el / 1e9;
}

int main(int argc, char **argv) {
    int64_t n = 4096, rows = 512;
    double budget = 0.1;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--n") == 0) n = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--rows") == 0) rows = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--time") == 0) budget = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--n N (multiple of 256)] [--rows R] [--time SECONDS]\n", argv[0]);
            return 1;
        }
    }
    if (n <= 0 || n % QK_K != 0 || rows <= 0 || budget <= 0) {
        fprintf(stderr, "bench_quant: --n must be a positive multiple of 256, --rows and --time positive\n");
        return 1;
    }
    const qf_type types[] = {QF_TYPE_F32, QF_TYPE_F16, QF_TYPE_BF16, QF_TYPE_Q8_0, QF_TYPE_Q5_0,
                             QF_TYPE_Q4_0, QF_TYPE_Q6_K, QF_TYPE_Q5_K, QF_TYPE_Q4_K};
    const bool avx2 = qf_quant_has_avx2();
    printf("bench_quant: n=%lld rows=%lld, %.2fs per measurement, AVX2 %s\n", (long long)n,
           (long long)rows, budget, avx2 ? "yes" : "no (fast = scalar)");
    printf("GB/s of weight bytes read; x = AVX2 / scalar\n");
    printf("%-5s %9s | %-28s | %-28s | %s\n", "type", "bytes/row", "dequantize: scalar  AVX2", "vec_dot: scalar  AVX2",
           "matvec  x vec_dot AVX2");
    float *tmp = malloc((size_t)n * sizeof(float)), *out = malloc((size_t)(n > rows ? n : rows) * sizeof(float));
    void *x = malloc((size_t)n * sizeof(float) + 64), *act = qf_malloc_aligned(qf_matvec_act_bytes(QF_TYPE_F16, n) + 64);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const qf_type t = types[k];
        const size_t rb = qf_row_bytes(t, n);
        uint8_t *w = malloc(rb * (size_t)rows);
        make_weights(t, w, n, rows, tmp);
        for (int64_t i = 0; i < n; i++) tmp[i] = rndf();
        qf_quantize_row_ref(qf_vec_dot_type(t), tmp, x, n);
        double r[2][2];
        for (int what = 0; what < 2; what++) {
            qf_quant_force_scalar(true);
            r[what][0] = measure(what, t, w, x, out, n, rows, budget);
            qf_quant_force_scalar(false);
            r[what][1] = measure(what, t, w, x, out, n, rows, budget);
        }
        printf("%-5s %9zu | %7.2f %7.2f %6.1fx     | %7.2f %7.2f %6.1fx    ", qf_type_name(t), rb, r[0][0],
               r[0][1], r[0][1] / r[0][0], r[1][0], r[1][1], r[1][1] / r[1][0]);
        if (qf_matvec_supported(t, n)) {
            qf_matvec_prepare(t, tmp, n, act);
            const double m = measure(2, t, w, act, out, n, rows, budget);
            printf(" | %7.2f %5.2fx\n", m, m / r[1][1]);
        } else
            printf(" | (none)\n");
        free(w);
    }
    free(tmp);
    free(out);
    free(x);
    free(act);
    return 0;
}
