/* hadamard.c: normalized Walsh-Hadamard transform (see hadamard.h). */
#include "kernels/hadamard.h"

#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

bool qf_hadamard_size_ok(int n) { return n >= 1 && (n & (n - 1)) == 0; }

void qf_hadamard(float *x, int n) {
    QF_ASSERT(qf_hadamard_size_ok(n)); /* callers validate sizes from files (head_dim) first */
    for (int len = 1; len < n; len <<= 1)
        for (int i = 0; i < n; i += len << 1)
            for (int j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

void qf_hadamard_rows(float *x, int n, int n_vec) {
    for (int r = 0; r < n_vec; r++) qf_hadamard(x + (size_t)r * n, n);
}

void qf_hadamard_ref(const float *src, float *dst, int n) {
    double s = 1.0 / sqrt((double)n);
    for (int i = 0; i < n; i++) {
        double acc = 0;
        for (int j = 0; j < n; j++) acc += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * src[j];
        dst[i] = (float)(acc * s);
    }
}
