/* util.h: the util layer (no model knowledge): mapped files, atomic writes, SHA-256,
 * the thread pool, f16/bf16 conversion, timing and the TTY progress bar.
 * Internal to the library; the public API lives in include/qforge/ (the part of this layer
 * programs outside the library use is include/qforge/util.h, included here). */
#ifndef QF_UTIL_H
#define QF_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qforge/error.h"
#include "qforge/util.h" /* the public part: qf_read_file, qf_write_file_atomic, qf_sha256(_file), qf_hex, qf_now_sec */

/* ---- programmer errors ----
 * QF_ASSERT(cond): an internal invariant that only a bug in qforge can break. It stays on in
 * release builds (as GGML_ASSERT does): when cond is false it prints "file:line: assertion
 * failed: cond" to stderr and aborts. Never for input validation: bad input (files, flags, API
 * arguments a caller can get wrong) gets a qf_error and a status, not an abort. */
#define QF_ASSERT(cond) (__builtin_expect(!!(cond), 1) ? (void)0 : qf_assert_fail(__FILE__, __LINE__, #cond))
#ifdef __cplusplus
[[noreturn]] void qf_assert_fail(const char *file, int line, const char *cond); /* the CUDA .cu files are C++ */
#else
_Noreturn void qf_assert_fail(const char *file, int line, const char *cond);
#endif

/* ---- files ---- */
typedef struct {
    const uint8_t *data; /* read-only mapping (NULL for an empty file) */
    size_t size;
    char path[4096];
} qf_mapped_file;

qf_status qf_map_file(const char *path, qf_mapped_file *mf, qf_error *err);
void qf_unmap_file(qf_mapped_file *mf);


/* Atomic output: bytes go to "<path>.tmp.<pid>" in the same directory; commit fsyncs the
 * file, renames it over `path` and fsyncs the directory; abort (or a crash) leaves `path`
 * untouched. A failed write (ENOSPC) reports QF_ERR_IO and removes the temp file. */
typedef struct {
    FILE *fp;
    char path[4096];
    char tmp_path[4200];
} qf_atomic_file;

qf_status qf_atomic_open(qf_atomic_file *af, const char *path, qf_error *err);
qf_status qf_atomic_write(qf_atomic_file *af, const void *buf, size_t n, qf_error *err);
qf_status qf_atomic_commit(qf_atomic_file *af, qf_error *err);
void qf_atomic_abort(qf_atomic_file *af);
/* ---- temporary files: removed on SIGINT/SIGTERM/SIGHUP, swept when their owner is dead ----
 * Every temp file (an atomic write's "<path>.tmp.<pid>", a qf_temp_create file) is registered
 * while it exists; the first registration installs handlers for SIGINT, SIGTERM and SIGHUP (not
 * for a signal the process ignores) that unlink every registered file and then die of the signal
 * as before. kill -9 cannot be caught, so creating a temp file also sweeps the ones a dead
 * process left: "<path>.tmp.<pid>" siblings of the same target, and "<prefix>-<pid>-*" in the
 * temp directory, whose <pid> is no longer alive (kill(pid, 0) says ESRCH). */

/* Create an empty private temp file $TMPDIR/<prefix>-<pid>-XXXXXX (default /tmp), registered
 * for removal on signals; its path goes to path (cap bytes). QF_ERR_IO naming the directory. */
qf_status qf_temp_create(const char *prefix, char *path, size_t cap, qf_error *err);
/* Unlink a qf_temp_create file (and its "<path>.tmp.<pid>" atomic sibling) and unregister it. */
void qf_temp_remove(const char *path);


/* ---- thread pool ----
 * A fixed set of workers that run one parallel-for at a time: fn(arg, ith, nth) is called
 * once for every ith in [0, nth) and qf_pool_run returns when all calls are done. The
 * calling thread takes part as ith = 0. nth == 1 runs inline with no synchronisation. */
typedef struct qf_pool qf_pool;
typedef void (*qf_pool_fn)(void *arg, int ith, int nth);

qf_pool *qf_pool_create(int n_threads);
void qf_pool_free(qf_pool *p);
int qf_pool_size(const qf_pool *p);
void qf_pool_run(qf_pool *p, qf_pool_fn fn, void *arg);

/* Split [0, n) into nth contiguous ranges; ranges for ith. */
static inline void qf_split_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    QF_ASSERT(nth >= 1 && ith >= 0 && ith < nth);
    int64_t per = (n + nth - 1) / nth;
    *lo = per * ith;
    *hi = *lo + per;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

/* ---- half precision (IEEE binary16 and bfloat16), exact round-to-nearest-even ---- */
/* h's value: zero and subnormals (m 2^-24, signed), normals, infinities and NaN payloads (the
 * mantissa shifted in); branch-free and inline, as every parse of f16 codes calls it per value */
static inline float qf_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    union { uint32_t u; float f; } n = {.u = (em << 13) + (112u << 23)}, x = {.u = (em << 13) | 0x7f800000u}, v;
    v.f = em < 0x0400 ? (float)em * 5.9604644775390625e-08f : em < 0x7c00 ? n.f : x.f; /* zero/subnormal, normal, inf/NaN */
    v.u |= sign;
    return v.f;
}
uint16_t qf_f32_to_f16(float f);
static inline float qf_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
uint16_t qf_f32_to_bf16(float f);

/* ---- time and progress ---- */

/* A one-line progress bar on stderr, drawn only when stderr is a TTY. */
typedef struct {
    const char *label;
    int64_t total;
    double t0, last_draw;
    bool tty;
} qf_progress;

void qf_progress_begin(qf_progress *p, const char *label, int64_t total);
void qf_progress_update(qf_progress *p, int64_t done);
void qf_progress_end(qf_progress *p);

/* ---- checked arithmetic for sizes read from files ---- */
static inline bool qf_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool qf_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

void *qf_malloc_aligned(size_t n); /* 64-byte aligned; free with free() */

/* ---- strict UTF-8 (RFC 3629): no overlong forms, surrogates or code points past U+10FFFF ----
 * qf_utf8_valid_len: length (1-4) of the valid sequence at s[0..n), 0 when s does not begin one
 * (or n == 0). qf_utf8_valid: whether all n bytes are valid UTF-8 (NUL bytes count as valid). */
size_t qf_utf8_valid_len(const uint8_t *s, size_t n);
bool qf_utf8_valid(const void *s, size_t n);

/* ---- seeded pseudo-random generators (a seed reproduces a sample, a dictionary, a draw) ---- */
static inline uint64_t qf_xorshift64s(uint64_t *s) { /* xorshift64*; *s must be nonzero */
    uint64_t x = *s;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static inline uint64_t qf_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Uniform double in [0, 1) from splitmix64 (53 random bits). */
static inline double qf_rand_unit(uint64_t *s) { return (double)(qf_splitmix64(s) >> 11) * 0x1.0p-53; }

/* ---- sorting ----
 * Sort the n finite floats v ascending, stably, -0.0 and +0.0 counting as equal (so they keep
 * their input order): the order a stable comparison sort with (x > y) - (x < y) gives (glibc's
 * qsort, which merge-sorts such arrays), by an LSD radix sort, 4-5x faster on millions of
 * values. false when its two n-word buffers cannot be allocated: v is then untouched. NaN: a
 * programmer error (the callers reject them first). */
bool qf_sort_floats(float *v, size_t n);

#endif
