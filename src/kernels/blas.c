/* blas.c: OpenBLAS loaded on first use; see blas.h for why it is not linked. */
#include "kernels/blas.h"

#include <cpuid.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int, int, float,
                         const float *, int, const float *, int, float, float *, int);
typedef void (*ssyrk_fn)(enum CBLAS_ORDER, enum CBLAS_UPLO, enum CBLAS_TRANSPOSE, int, int, float, const float *,
                         int, float, float *, int);
typedef void (*set_threads_fn)(int);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static sgemm_fn sgemm;
static ssyrk_fn ssyrk;
static char load_error[512];
static int checked_threads; /* callers whose buffers were found to fit (under mu) */

/* AVX-512 F, CD, DQ, BW and VL with the OS saving zmm state: what OpenBLAS's SkylakeX kernels use */
static bool cpu_has_avx512_skx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 0xE6) != 0xE6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const unsigned need = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31); /* F DQ CD BW VL */
    return (b & need) == need;
}

static void load(void) {
    /* before the library's constructor runs: it starts one thread per core otherwise */
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    /* Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) does not know AMD Zen 4/5 and picks its Haswell
     * (AVX2) kernels there; on a CPU with AVX-512 its SkylakeX sgemm is 1.7x faster (measured on
     * the 2-core Zen development machine: 92 -> 162 GFLOP/s per core, docs/engine.md). Only when
     * the user has not chosen a core type. */
    if (cpu_has_avx512_skx()) setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
    const char *names[] = {"libopenblas.so.0", "libopenblas.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error, "%s", e ? e : "libopenblas.so.0 not found");
        return;
    }
    set_threads_fn set = (set_threads_fn)dlsym(h, "openblas_set_num_threads");
    sgemm_fn f = (sgemm_fn)dlsym(h, "cblas_sgemm");
    ssyrk_fn g = (ssyrk_fn)dlsym(h, "cblas_ssyrk");
    if (!f || !g) {
        snprintf(load_error, sizeof load_error, "libopenblas has no cblas_sgemm/cblas_ssyrk");
        return;
    }
    if (set) set(1);
    ssyrk = g;
    sgemm = f;
}

/* Whether `bytes` more of address space can be mapped now (PROT_NONE: no memory is used). */
static bool address_space_fits(size_t bytes) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return true;
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    munmap(p, bytes);
    return true;
}

qf_status qf_blas_init(int n_threads, qf_error *err) {
    pthread_once(&once, load);
    if (!sgemm) {
        bool nomem = strstr(load_error, "map") || strstr(load_error, "memory");
        return qf_fail(err, nomem ? QF_ERR_NOMEM : QF_ERR_UNSUPPORTED,
                       nomem ? "out of memory loading OpenBLAS: %s"
                             : "OpenBLAS is needed for the fast CPU path: %s (apt-get install libopenblas0)",
                       load_error);
    }
    if (n_threads < 1) n_threads = 1;
    qf_status st = QF_OK;
    pthread_mutex_lock(&mu);
    if (n_threads > checked_threads) {
        size_t need = (size_t)(n_threads - checked_threads) * QF_BLAS_BUFFER_BYTES;
        if (address_space_fits(need)) checked_threads = n_threads;
        else
            st = qf_fail(err, QF_ERR_NOMEM,
                         "out of memory: the address-space limit (ulimit -v) leaves no room for the BLAS work "
                         "buffers (%d threads x %zu MiB); use fewer threads (-t) or raise the limit",
                         n_threads, QF_BLAS_BUFFER_BYTES >> 20);
    }
    pthread_mutex_unlock(&mu);
    return st;
}

/* The library, loaded now if nobody called qf_blas_init; a missing OpenBLAS is fatal here. */
static void need_blas(void) {
    pthread_once(&once, load);
    if (!sgemm) {
        fprintf(stderr, "qforge: OpenBLAS is needed and cannot be loaded: %s\n", load_error);
        abort();
    }
}

void qf_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
              float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    need_blas();
    sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void qf_ssyrk(enum CBLAS_ORDER order, enum CBLAS_UPLO uplo, enum CBLAS_TRANSPOSE trans, int n, int k, float alpha,
              const float *a, int lda, float beta, float *c, int ldc) {
    need_blas();
    ssyrk(order, uplo, trans, n, k, alpha, a, lda, beta, c, ldc);
}
