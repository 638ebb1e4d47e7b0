/* qforge/gguf.h: GGUF v2/v3 reader (mmap, every field validated against the file size)
 * and a writer that round-trips what the reader reads.
 *
 * Every pointer the reader hands out points into the read-only mapping and stays valid
 * until qf_gguf_close(). Strings in GGUF are not NUL-terminated: they come with a length. */
#ifndef QFORGE_GGUF_H
#define QFORGE_GGUF_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/error.h"
#include "qforge/quant.h"

typedef enum {
    QF_GGUF_UINT8 = 0,
    QF_GGUF_INT8 = 1,
    QF_GGUF_UINT16 = 2,
    QF_GGUF_INT16 = 3,
    QF_GGUF_UINT32 = 4,
    QF_GGUF_INT32 = 5,
    QF_GGUF_FLOAT32 = 6,
    QF_GGUF_BOOL = 7,
    QF_GGUF_STRING = 8,
    QF_GGUF_ARRAY = 9,
    QF_GGUF_UINT64 = 10,
    QF_GGUF_INT64 = 11,
    QF_GGUF_FLOAT64 = 12,
    QF_GGUF_TYPE_COUNT
} qf_gguf_type;

typedef struct {
    const char *ptr; /* into the mapping, not NUL-terminated */
    uint64_t len;
} qf_gguf_str;

/* A metadata value. Scalars are decoded; arrays keep a pointer to their first element in the
 * mapping plus the element type and count (nested arrays: elem_type == QF_GGUF_ARRAY, walk
 * them with qf_gguf_array_get). */
typedef struct qf_gguf_value {
    qf_gguf_type type;
    union {
        uint64_t u64; /* UINT8..UINT64 and BOOL widened */
        int64_t i64;  /* INT8..INT64 widened */
        double f64;   /* FLOAT32/FLOAT64 widened */
        qf_gguf_str str;
        struct {
            qf_gguf_type elem_type;
            uint64_t count;
            const uint8_t *data; /* first element in the mapping */
            uint64_t nbytes;     /* bytes the array occupies in the file */
        } arr;
    } v;
} qf_gguf_value;

typedef struct {
    qf_gguf_str key;
    qf_gguf_value value;
} qf_gguf_kv;

#define QF_GGUF_MAX_DIMS 4

typedef struct {
    qf_gguf_str name;
    uint32_t n_dims;
    int64_t ne[QF_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims = 1 */
    qf_type type;
    uint64_t offset;  /* relative to the data section */
    const void *data; /* into the mapping */
    uint64_t nbytes;
} qf_gguf_tensor;

typedef struct qf_gguf qf_gguf;

/* Open and validate a GGUF file. On failure returns NULL and err says which field of which
 * file is wrong ("model.gguf: tensor 12 'blk.1.attn_q.weight': offset ... past end of file"). */
QF_API qf_gguf *qf_gguf_open(const char *path, qf_error *err);
/* Same, over a caller-owned buffer (fuzzing, tests); the buffer must outlive the handle. */
QF_API qf_gguf *qf_gguf_open_buffer(const void *data, size_t size, const char *name, qf_error *err);
QF_API void qf_gguf_close(qf_gguf *g);

QF_API const char *qf_gguf_path(const qf_gguf *g);
QF_API uint32_t qf_gguf_version(const qf_gguf *g);
QF_API uint64_t qf_gguf_alignment(const qf_gguf *g);
QF_API uint64_t qf_gguf_data_offset(const qf_gguf *g);
QF_API const uint8_t *qf_gguf_file_data(const qf_gguf *g, size_t *size);

QF_API uint64_t qf_gguf_n_kv(const qf_gguf *g);
QF_API const qf_gguf_kv *qf_gguf_kv_at(const qf_gguf *g, uint64_t i);
QF_API const qf_gguf_value *qf_gguf_find(const qf_gguf *g, const char *key); /* NULL if absent */

/* Typed getters: return false when the key is absent or has an incompatible type.
 * Integer getters accept any integer type whose value fits; get_f32 accepts floats and ints. */
QF_API bool qf_gguf_get_u32(const qf_gguf *g, const char *key, uint32_t *out);
QF_API bool qf_gguf_get_i64(const qf_gguf *g, const char *key, int64_t *out);
QF_API bool qf_gguf_get_f32(const qf_gguf *g, const char *key, float *out);
QF_API bool qf_gguf_get_bool(const qf_gguf *g, const char *key, bool *out);
/* Copies into a NUL-terminated buffer; false if absent, not a string, or truncated. */
QF_API bool qf_gguf_get_str(const qf_gguf *g, const char *key, char *buf, size_t cap);

/* Element i of an array value (bounds-checked; nested arrays decode into another array
 * value). Returns false when i is out of range. Element access of a string array is O(1)
 * after the first call: the reader indexes string arrays when it opens the file. */
QF_API bool qf_gguf_array_get(const qf_gguf *g, const qf_gguf_value *arr, uint64_t i, qf_gguf_value *out);

QF_API uint64_t qf_gguf_n_tensors(const qf_gguf *g);
QF_API const qf_gguf_tensor *qf_gguf_tensor_at(const qf_gguf *g, uint64_t i);
QF_API const qf_gguf_tensor *qf_gguf_find_tensor(const qf_gguf *g, const char *name);
QF_API int64_t qf_gguf_tensor_nelements(const qf_gguf_tensor *t);

QF_API const char *qf_gguf_type_name(qf_gguf_type t);

/* ---- writer ----
 * Collect metadata and tensors, then write atomically. Tensor data is copied by pointer
 * (the caller keeps it alive until qf_gguf_writer_write returns). Keys keep insertion order;
 * setting an existing key replaces its value in place. */
typedef struct qf_gguf_writer qf_gguf_writer;

QF_API qf_gguf_writer *qf_gguf_writer_new(void);
QF_API void qf_gguf_writer_free(qf_gguf_writer *w);
/* Copy every KV pair of an opened file (values deep-copied), optionally skipping keys with
 * a given prefix (NULL = copy all). */
QF_API qf_status qf_gguf_writer_copy_kv(qf_gguf_writer *w, const qf_gguf *src, const char *skip_prefix,
                                 qf_error *err);
QF_API qf_status qf_gguf_writer_set_u32(qf_gguf_writer *w, const char *key, uint32_t v);
QF_API qf_status qf_gguf_writer_set_f32(qf_gguf_writer *w, const char *key, float v);
QF_API qf_status qf_gguf_writer_set_bool(qf_gguf_writer *w, const char *key, bool v);
QF_API qf_status qf_gguf_writer_set_str(qf_gguf_writer *w, const char *key, const char *v);
QF_API qf_status qf_gguf_writer_set_value(qf_gguf_writer *w, const char *key, const qf_gguf *src,
                                   const qf_gguf_value *v); /* deep copy (arrays too) */
QF_API qf_status qf_gguf_writer_add_tensor(qf_gguf_writer *w, const char *name, qf_type type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    uint64_t nbytes, qf_error *err);
QF_API qf_status qf_gguf_writer_write(qf_gguf_writer *w, const char *path, qf_error *err);

#endif
