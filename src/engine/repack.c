/* repack.c: the CPU's private repacked copies of a model's Q4_0 weights (kernels/gemm.h: Q4X16).
 *
 * Decode reads every weight byte once per token; from the GGUF rows the Q4_0 kernel spends a
 * byte gather and a horizontal sum per row and reads one row per step. Repacked once into 16-row
 * panels (one 64-byte load = 4 quant bytes of 16 rows, the lanes of one vpdpbusd), the same math
 * runs with neither, for decode and for the prefill GEMM (no per-tile packing either), bit-identical
 * to the GEMM oracle on the GGUF rows.
 *
 * The copy is the model's, made by the first CPU context (qf_context_new) and shared by the others;
 * the qf_weight views (the GPU upload, the forge, the public model API) keep pointing at the mapped
 * GGUF bytes, untouched. Once a weight is repacked the CPU forward pass no longer reads its GGUF
 * bytes, and their pages are handed back to the page cache (MADV_DONTNEED on the private read-only
 * file mapping: a later reader faults them in again from the file), so the resident memory stays
 * one copy of the weights, not two. Lookup: by the weight's data pointer and shape, binary search. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kernels/gemm.h"

typedef struct {
    const void *data; /* the GGUF rows (qf_weight.data) */
    size_t row_bytes;
    int64_t K, N;
    size_t off; /* the repacked weight at buf + off */
} repack_entry;

struct qf_repack {
    repack_entry *e;
    size_t n;
    uint8_t *buf; /* one anonymous mapping (2 MB aligned, MADV_HUGEPAGE) */
    void *map;
    size_t map_bytes;
};

static pthread_mutex_t repack_mu = PTHREAD_MUTEX_INITIALIZER;

/* true for a weight the forward pass multiplies on the CPU and the repacked kernel takes */
static bool repackable(const qf_weight *w) {
    return w && w->data && w->type == QF_TYPE_Q4_0 && qf_gemm_q4x16_shape_ok(w->ne0, w->ne1) &&
           w->row_bytes == qf_row_bytes(QF_TYPE_Q4_0, w->ne0);
}

/* append w to e[*n] unless its data is already there (tied output = tok_embd) */
static void collect(const qf_weight *w, repack_entry *e, size_t *n) {
    if (!repackable(w)) return;
    for (size_t i = 0; i < *n; i++)
        if (e[i].data == w->data && e[i].K == w->ne0 && e[i].N == w->ne1) return;
    e[*n] = (repack_entry){.data = w->data, .row_bytes = w->row_bytes, .K = w->ne0, .N = w->ne1};
    (*n)++;
}

static int entry_cmp(const void *a, const void *b) {
    const repack_entry *x = a, *y = b;
    if (x->data != y->data) return (uintptr_t)x->data < (uintptr_t)y->data ? -1 : 1;
    if (x->K != y->K) return x->K < y->K ? -1 : 1;
    return x->N < y->N ? -1 : x->N > y->N;
}

/* the page-aligned interior of [p, p + n): handed back to the page cache after its repack */
static void drop_pages(const void *p, size_t n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + n) & ~(pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

typedef struct {
    const struct qf_repack *rp;
    size_t *panel0; /* entry i owns the global panels [panel0[i], panel0[i + 1]) */
} pack_job;

/* contract: thread ith of nth packs its share of all panels of all entries */
static void pack_worker(void *arg, int ith, int nth) {
    const pack_job *j = arg;
    const struct qf_repack *rp = j->rp;
    int64_t g0, g1;
    qf_split_range((int64_t)j->panel0[rp->n], ith, nth, &g0, &g1);
    for (size_t i = 0; i < rp->n && g0 < g1; i++) {
        const repack_entry *en = &rp->e[i];
        int64_t a = (int64_t)j->panel0[i], b = (int64_t)j->panel0[i + 1];
        if (b <= g0 || a >= g1) continue;
        int64_t p0 = (g0 > a ? g0 : a) - a, p1 = (g1 < b ? g1 : b) - a;
        qf_gemm_q4x16_pack(en->data, en->row_bytes, en->K, en->N, p0, p1, rp->buf + en->off);
        /* as we go, so the two copies are never resident at once (pages shared with the rows of
         * another thread's range or another tensor stay: at most a page at each end) */
        int64_t r0 = p0 * QF_GEMM_NR, r1 = p1 * QF_GEMM_NR < en->N ? p1 * QF_GEMM_NR : en->N;
        drop_pages((const uint8_t *)en->data + (size_t)r0 * en->row_bytes, (size_t)(r1 - r0) * en->row_bytes);
    }
}

void qf_model_repack(qf_model *m, qf_pool *pool) {
    pthread_mutex_lock(&repack_mu);
    if (atomic_load(&m->repack) || m->repack_tried || !qf_gemm_q4x16_supported()) goto out;
    m->repack_tried = true;
    const qf_hparams *hp = &m->hp;
    size_t cap = 1 + (size_t)hp->n_layer * (10 + 3 * (size_t)hp->n_expert);
    struct qf_repack *rp = calloc(1, sizeof *rp);
    repack_entry *e = calloc(cap, sizeof *e);
    if (!rp || !e) goto fail;
    size_t n = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const qf_layer_weights *L = &m->layers[il];
        const qf_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                 &L->w_gate_shexp, &L->w_up_shexp, &L->w_down_shexp};
        for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) collect(ws[k], e, &n);
        if (L->exp_gate)
            for (int x = 0; x < hp->n_expert; x++) {
                collect(&L->exp_gate[x], e, &n);
                collect(&L->exp_up[x], e, &n);
                collect(&L->exp_down[x], e, &n);
            }
    }
    collect(&m->output, e, &n);
    if (!n) goto fail;
    qsort(e, n, sizeof *e, entry_cmp);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        e[i].off = bytes;
        bytes += (qf_gemm_q4x16_bytes(e[i].K, e[i].N) + 63) & ~(size_t)63;
    }
    const size_t huge = (size_t)2 << 20;
    rp->map_bytes = bytes + huge;
    rp->map = mmap(NULL, rp->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (rp->map == MAP_FAILED) { /* no memory for the copy: the GGUF rows serve, as before */
        rp->map = NULL;
        goto fail;
    }
    rp->buf = (uint8_t *)(((uintptr_t)rp->map + huge - 1) & ~(uintptr_t)(huge - 1));
    (void)madvise(rp->buf, bytes, MADV_HUGEPAGE); /* fewer TLB misses while streaming; a hint only */
    rp->e = e;
    rp->n = n;
    size_t *panel0 = malloc((n + 1) * sizeof *panel0);
    if (!panel0) goto fail;
    panel0[0] = 0;
    for (size_t i = 0; i < n; i++) panel0[i + 1] = panel0[i] + (size_t)((e[i].N + QF_GEMM_NR - 1) / QF_GEMM_NR);
    pack_job j = {.rp = rp, .panel0 = panel0};
    qf_pool_run(pool, pack_worker, &j);
    free(panel0);
    atomic_store_explicit(&m->repack, rp, memory_order_release);
    goto out;
fail:
    if (rp && rp->map) munmap(rp->map, rp->map_bytes);
    free(rp);
    free(e);
out:
    pthread_mutex_unlock(&repack_mu);
}

const uint8_t *qf_model_repacked(const qf_model *m, const qf_weight *w) {
    const struct qf_repack *rp = atomic_load_explicit(&m->repack, memory_order_acquire);
    if (!rp || !w->data || w->type != QF_TYPE_Q4_0) return NULL;
    repack_entry key = {.data = w->data, .K = w->ne0, .N = w->ne1};
    const repack_entry *f = bsearch(&key, rp->e, rp->n, sizeof key, entry_cmp);
    return f ? rp->buf + f->off : NULL;
}

size_t qf_model_repacked_bytes(const qf_model *m) {
    const struct qf_repack *rp = atomic_load(&m->repack);
    return rp ? rp->map_bytes : 0;
}

void qf_model_repack_free(qf_model *m) {
    struct qf_repack *rp = atomic_load(&m->repack);
    if (!rp) return;
    munmap(rp->map, rp->map_bytes);
    free(rp->e);
    free(rp);
    atomic_store(&m->repack, NULL);
}

/* Once per model: fault the whole mapped file into the page tables now (MADV_POPULATE_READ:
 * sequential readahead from disk if the page cache lost it), as llama.cpp's loader does with
 * MAP_POPULATE, so the first batch does not pay ~110k page faults (and, after the page cache was
 * reclaimed, the disk reads) inside its evaluation: measured on the 1B f16 PPL pass, 2 chunks,
 * 84 tok/s with 341 major faults in the run against 108 with 8. Files larger than half the RAM
 * only get MADV_WILLNEED (asynchronous readahead the kernel may drop). */
void qf_model_prefault(qf_model *m) {
    pthread_mutex_lock(&repack_mu);
    if (!m->prefaulted) {
        m->prefaulted = true;
        size_t size = 0;
        const uint8_t *data = qf_gguf_file_data(m->gguf, &size);
        const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t a = (uintptr_t)data & ~(pg - 1);
        long pages = sysconf(_SC_PHYS_PAGES);
        if (data && size) {
            size_t len = (size_t)((uintptr_t)data + size - a);
            bool fits = pages > 0 && size < (size_t)pages * (size_t)pg / 2;
#ifdef MADV_POPULATE_READ
            if (!fits || madvise((void *)a, len, MADV_POPULATE_READ) != 0)
#endif
                (void)madvise((void *)a, len, MADV_WILLNEED);
        }
    }
    pthread_mutex_unlock(&repack_mu);
}
