/* vecmath.c: dispatch of the elementwise kernels (see vecmath.h). */
#include <math.h>

#include "kernels/vecmath.h"
#include "qforge/quant.h"

void qf_vec_exp_ref(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = expf(x[i]);
}

void qf_vec_exp(float *x, int n) {
    if (qf_quant_has_avx2() && qf_vec_exp_avx2(x, n)) return;
    qf_vec_exp_ref(x, n);
}
