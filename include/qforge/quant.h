/* qforge/quant.h: ggml tensor block formats, their (de)quantization and dot products.
 *
 * The enum values are ggml's, so a type id read from a GGUF file can be used directly.
 * Every kernel has a scalar version (the oracle, suffix _ref) and a fast version that is
 * tested against it; qf_* without suffix dispatches to the fastest one this CPU runs. */
#ifndef QFORGE_QUANT_H
#define QFORGE_QUANT_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    QF_TYPE_F32 = 0,
    QF_TYPE_F16 = 1,
    QF_TYPE_Q4_0 = 2,
    QF_TYPE_Q4_1 = 3,
    QF_TYPE_Q5_0 = 6,
    QF_TYPE_Q5_1 = 7,
    QF_TYPE_Q8_0 = 8,
    QF_TYPE_Q8_1 = 9,
    QF_TYPE_Q2_K = 10,
    QF_TYPE_Q3_K = 11,
    QF_TYPE_Q4_K = 12,
    QF_TYPE_Q5_K = 13,
    QF_TYPE_Q6_K = 14,
    QF_TYPE_Q8_K = 15,
    QF_TYPE_I8 = 24,
    QF_TYPE_I16 = 25,
    QF_TYPE_I32 = 26,
    QF_TYPE_I64 = 27,
    QF_TYPE_F64 = 28,
    QF_TYPE_BF16 = 30,
    QF_TYPE_COUNT = 40
} qf_type;

/* ggml's name ("q4_K", "f16", ...) or NULL for an id ggml does not define. */
QF_API const char *qf_type_name(qf_type t);
/* Parse a name as used on the command line ("f16", "q8_0", "q4_0", case-insensitive). */
QF_API bool qf_type_from_name(const char *name, qf_type *out);
/* Known to ggml (size is defined) vs. runnable by our kernels. */
QF_API bool qf_type_is_known(qf_type t);
QF_API bool qf_type_is_supported(qf_type t); /* F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q4_K Q5_K Q6_K */
QF_API int64_t qf_type_block_elems(qf_type t); /* elements per block (1 for float types) */
QF_API size_t qf_type_block_bytes(qf_type t);  /* bytes per block */
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or the byte count
 * overflows size_t. */
QF_API size_t qf_row_bytes(qf_type t, int64_t n);

/* The activation format a weight type's dot product consumes (ggml's vec_dot_type):
 * F32->F32, F16->F16, BF16->BF16, Q4_0/Q5_0/Q8_0->Q8_0, Q4_K/Q5_K/Q6_K->Q8_K. */
QF_API qf_type qf_vec_dot_type(qf_type t);

/* Dequantize n elements (n a multiple of the block size). */
QF_API void qf_dequantize_row(qf_type t, const void *src, float *dst, int64_t n);
/* qf_dequantize_row of n_rows rows, `stride` bytes apart from src, into dst [n_rows][n]: the same
 * floats, one dispatch (the KV cache's reads: one head's rows, strided by the other heads) */
QF_API void qf_dequantize_rows(qf_type t, const void *src, size_t stride, int64_t n_rows, float *dst, int64_t n);
QF_API void qf_dequantize_row_ref(qf_type t, const void *src, float *dst, int64_t n);

/* Quantize n floats to type t. Supported targets: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q8_K
 * (round-to-nearest, bit-exact with ggml's reference quantizers). Returns false otherwise. */
QF_API bool qf_quantize_row(qf_type t, const float *src, void *dst, int64_t n);
QF_API bool qf_quantize_row_ref(qf_type t, const float *src, void *dst, int64_t n);

/* Dot product of a weight row of type t with an activation row already in qf_vec_dot_type(t). */
QF_API float qf_vec_dot(qf_type t, int64_t n, const void *w, const void *x);
QF_API float qf_vec_dot_ref(qf_type t, int64_t n, const void *w, const void *x);

/* True when the fast (AVX2/FMA/F16C) kernels are in use on this CPU. */
QF_API bool qf_quant_has_avx2(void);
/* Force the scalar oracle everywhere (tests, the reference capture route). */
QF_API void qf_quant_force_scalar(bool on);

#endif
