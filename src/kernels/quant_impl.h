/* quant_impl.h: the ggml block layouts and the kernel entry points shared by quant.c (the
 * scalar oracle and dispatch) and quant_avx2.c (the fast kernels). Internal to the library.
 * The block layouts themselves are defined once, in format/quant_blocks.h. */
#ifndef QF_QUANT_IMPL_H
#define QF_QUANT_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "format/quant_blocks.h"
#include "qforge/quant.h"

/* The AVX2/FMA/F16C kernels (quant_avx2.c). Call only when the CPU has all three.
 * Each returns false for a type it has no fast version of (the caller then uses the oracle). */
bool qf_dequantize_row_avx2(qf_type t, const void *src, float *dst, int64_t n);
bool qf_quantize_row_avx2(qf_type t, const float *src, void *dst, int64_t n);
bool qf_vec_dot_avx2(qf_type t, int64_t n, const void *w, const void *x, float *out);

#endif
