/* vecmath.h: elementwise math on float arrays for the forward pass: exp in place (softmax,
 * SiLU). The scalar version (expf) is the oracle; the AVX2/FMA version (vecmath_avx2.c, chosen
 * at run time with the quant kernels' CPU check) is within 2e-7 relative of it. */
#ifndef QF_VECMATH_H
#define QF_VECMATH_H

#include <stdbool.h>

void qf_vec_exp(float *x, int n);     /* x[i] = exp(x[i]), fastest kernel this CPU runs */
void qf_vec_exp_ref(float *x, int n); /* the oracle: expf */
bool qf_vec_exp_avx2(float *x, int n); /* false when not built for AVX2 */

#endif
