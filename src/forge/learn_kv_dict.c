/* learn_kv_dict.c: the kv-dict learner: approximate k-SVD over batch OMP. The encoder is the
 * engine's (qf_kv_omp_ex, src/engine/kv_codes.c): training passes feed it correlations
 * X*D^T computed by sgemm (kernels/blas.h) over fixed chunks of vectors (a fast path that may differ
 * from the cache's own correlations in the last bit), while qf_kv_dict_encode, which every
 * measurement uses, lets the encoder compute them exactly as the dict cache does.
 *
 * Determinism: each vector's code depends only on the vector, the dictionary and its
 * correlations (from an identical sgemm call whatever the thread count), so the thread
 * count only changes who computes which vector. Sums are taken in vector order on the
 * calling thread. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_codes.h"
#include "kernels/blas.h"
#include "qforge/kvlearn.h"
#include "util/util.h"


double qf_rel_mse(const float *x, const float *xr, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)x[i] - (double)xr[i];
        num += e * e;
        den += (double)x[i] * (double)x[i];
    }
    if (!(num == num) || !(den == den)) return 1.0; /* NaN anywhere: as bad as it gets */
    if (den <= 0) return num > 0 ? 1.0 : 0.0;
    double r = num / den;
    return r < 0 ? 0 : r > 1 ? 1 : r;
}

void qf_kv_dict_params_default(qf_kv_dict_params *p) {
    memset(p, 0, sizeof *p);
    p->n_atoms = 256;
    p->sparsity = 8;
    p->iters = 20;
    p->seed = 1;
    p->n_threads = 1;
}

/* The Gram matrix the encoder's correlation updates read and, when gram_d is not NULL, the
 * double table of its Cholesky dots (qf_kv_gram_d) */
static void compute_gram(qf_kv_dict *d, double *gram_d) {
    qf_kv_gram(d->atoms, d->n_atoms, d->head_dim, d->gram);
    if (gram_d) qf_kv_gram_d(d, gram_d);
}

static double dot_d(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

/* Scale a row to unit norm; false (row untouched) when it is zero or not finite. */
static bool normalize_row(float *a, int n) {
    double nn = dot_d(a, a, n);
    if (!(nn > 1e-30) || !isfinite(nn)) return false;
    float inv = (float)(1.0 / sqrt(nn));
    for (int i = 0; i < n; i++) a[i] *= inv;
    return true;
}

/* ---- batch OMP: the engine's encoder over a chunk ----
 * Unused slots get idx -1 / coef 0 (the k-SVD bookkeeping skips them). */
static int omp_one(const qf_kv_dict *d, const double *gram_d, const float *x, const float *alpha0, int s,
                   double tol, void *scratch, uint16_t *i16, int32_t *idx, float *coef) {
    int k = qf_kv_omp_gd(d, gram_d, x, alpha0, s, tol, scratch, i16, coef);
    for (int j = 0; j < s; j++) idx[j] = j < k ? (int32_t)i16[j] : -1;
    return k;
}

/* Squared residual of one code, in double. */
static double code_err(const qf_kv_dict *d, const float *x, const int32_t *idx, const float *coef,
                       int s, float *r /* scratch [dim] */) {
    const int dim = d->head_dim;
    for (int i = 0; i < dim; i++) r[i] = x[i];
    for (int j = 0; j < s; j++) {
        if (idx[j] < 0) continue;
        const float *a = d->atoms + (size_t)idx[j] * dim;
        for (int i = 0; i < dim; i++) r[i] -= coef[j] * a[i];
    }
    return dot_d(r, r, dim);
}

/* code_err of two codes of x, their two sums side by side (independent chains, each in the
 * order code_err adds) */
static void code_err2(const qf_kv_dict *d, const float *x, const int32_t *ia, const float *ca, const int32_t *ib,
                      const float *cb, int s, float *ra, float *rb /* scratch [dim] each */, double *ea, double *eb) {
    const int dim = d->head_dim;
    for (int i = 0; i < dim; i++) ra[i] = x[i], rb[i] = x[i];
    for (int j = 0; j < s; j++) {
        if (ia[j] >= 0) {
            const float *a = d->atoms + (size_t)ia[j] * dim;
            for (int i = 0; i < dim; i++) ra[i] -= ca[j] * a[i];
        }
        if (ib[j] >= 0) {
            const float *a = d->atoms + (size_t)ib[j] * dim;
            for (int i = 0; i < dim; i++) rb[i] -= cb[j] * a[i];
        }
    }
    double sa = 0, sb = 0;
    for (int i = 0; i < dim; i++) {
        sa += (double)ra[i] * (double)ra[i];
        sb += (double)rb[i] * (double)rb[i];
    }
    *ea = sa, *eb = sb;
}

/* ---- a parallel OMP pass over n vectors ----
 * Vectors go in fixed chunks of CORR_ROWS (the same for any thread count, so each vector's
 * correlations come out of an identical sgemm call). OpenBLAS runs single-threaded during
 * learning (qf_kv_dict_learn sets it, as the engine's contexts do): its own threads would
 * otherwise spin in sched_yield against our pool for the second core. */
#define CORR_ROWS 64
static int corr_rows(int n_atoms, int dim) {
    (void)n_atoms, (void)dim;
    return CORR_ROWS;
}

typedef struct {
    const qf_kv_dict *d;
    const double *gram_d; /* qf_kv_gram_d of d, or NULL */
    const float *x;
    int64_t n;
    int s;
    double tol;
    bool exact;       /* the encoder computes the correlations itself (the cache's path) */
    int32_t *idx;
    float *coef;
    double *err;      /* per vector squared residual of the new code */
    uint8_t *used;    /* per vector atoms used, or NULL */
    bool keep_better; /* compare with the current code in idx/coef, keep the better */
    bool oom;
} omp_job;

static void omp_worker(void *arg, int ith, int nth) {
    omp_job *jb = arg;
    const qf_kv_dict *d = jb->d;
    const int s = jb->s, dim = d->head_dim, A = d->n_atoms, rows = corr_rows(A, dim);
    int64_t c_lo, c_hi;
    qf_split_range((jb->n + rows - 1) / rows, ith, nth, &c_lo, &c_hi);
    if (c_lo >= c_hi) return;
    void *w = malloc(qf_kv_omp_scratch_bytes(A, s));
    int32_t *ni = malloc(sizeof(int32_t) * (size_t)s);
    uint16_t *n16 = malloc(sizeof(uint16_t) * (size_t)s);
    float *nc = malloc(sizeof(float) * (size_t)s);
    float *r = malloc(sizeof(float) * (size_t)dim), *r2 = malloc(sizeof(float) * (size_t)dim);
    float *corr = jb->exact ? NULL : malloc(sizeof(float) * (size_t)rows * A);
    if (!w || !ni || !n16 || !nc || !r || !r2 || (!jb->exact && !corr)) {
        jb->oom = true; /* distinct threads only ever set it to true */
        goto done;
    }
    for (int64_t c = c_lo; c < c_hi; c++) {
        int64_t lo = c * rows, hi = lo + rows < jb->n ? lo + rows : jb->n;
        if (!jb->exact)
            qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(hi - lo), A, dim, 1.0f,
                        jb->x + (size_t)lo * dim, dim, d->atoms, dim, 0.0f, corr, A);
        for (int64_t i = lo; i < hi; i++) {
            const float *x = jb->x + (size_t)i * dim;
            int32_t *ci = jb->idx + (size_t)i * s;
            float *cc = jb->coef + (size_t)i * s;
            int k = omp_one(d, jb->gram_d, x, jb->exact ? NULL : corr + (size_t)(i - lo) * A, s, jb->tol, w, n16, ni, nc);
            if (jb->used) jb->used[i] = (uint8_t)k;
            double e_new, e_old = 0;
            if (jb->keep_better)
                code_err2(d, x, ni, nc, ci, cc, s, r, r2, &e_new, &e_old);
            else
                e_new = code_err(d, x, ni, nc, s, r);
            if (jb->keep_better) {
                if (e_old < e_new) {
                    jb->err[i] = e_old;
                    continue;
                }
            }
            memcpy(ci, ni, sizeof(int32_t) * (size_t)s);
            memcpy(cc, nc, sizeof(float) * (size_t)s);
            jb->err[i] = e_new;
        }
    }
done:
    free(w);
    free(n16);
    free(ni);
    free(nc);
    free(r);
    free(r2);
    free(corr);
}

/* Code all n vectors; err[i] gets each squared residual. */
static qf_status omp_pass(const qf_kv_dict *d, const double *gram_d, const float *x, int64_t n, int s,
                          double tol, bool exact, qf_pool *pool, int32_t *idx, float *coef, double *err,
                          uint8_t *used, bool keep_better, qf_error *e) {
    omp_job jb = {.d = d, .gram_d = gram_d, .x = x, .n = n, .s = s, .tol = tol, .exact = exact, .idx = idx,
                  .coef = coef, .err = err, .used = used, .keep_better = keep_better};
    qf_pool_run(pool, omp_worker, &jb);
    if (jb.oom) return qf_fail(e, QF_ERR_NOMEM, "kv dict: OMP scratch: out of memory");
    return QF_OK;
}

static qf_status check_dims(const qf_kv_dict *d, int s, qf_error *err) {
    if (!d || !d->atoms || !d->gram)
        return qf_fail(err, QF_ERR_ARG, "kv dict: dictionary: expected an initialised dictionary");
    if (s < 1 || s > d->head_dim || s > d->n_atoms || s > QF_KV_MAX_SPARSITY)
        return qf_fail(err, QF_ERR_ARG,
                       "kv dict: sparsity %d: expected 1..min(head_dim %d, n_atoms %d, %d)", s,
                       d->head_dim, d->n_atoms, QF_KV_MAX_SPARSITY);
    return QF_OK;
}

qf_status qf_kv_dict_encode(const qf_kv_dict *d, const float *x, int64_t n, int s, int n_threads,
                            uint16_t *idx, float *coef, qf_error *err) {
    return qf_kv_dict_encode_ex(d, x, n, s, 0, n_threads, idx, coef, NULL, err);
}

qf_status qf_kv_dict_encode_ex(const qf_kv_dict *d, const float *x, int64_t n, int s, double tol,
                               int n_threads, uint16_t *idx, float *coef, uint8_t *used,
                               qf_error *err) {
    qf_status st = check_dims(d, s, err);
    if (st) return st;
    if (n <= 0) return QF_OK;
    int32_t *ci = malloc(sizeof(int32_t) * (size_t)n * (size_t)s);
    double *e = malloc(sizeof(double) * (size_t)n);
    qf_pool *pool = n_threads > 1 && n >= 64 ? qf_pool_create(n_threads) : NULL;
    /* the Cholesky dots as a table when it pays (n vectors of ~s^2/2 dots against n_atoms^2 / 2
     * once) and stays small; without it the encoder computes the same values itself */
    double *gd = n >= d->n_atoms && d->n_atoms <= QF_KV_GRAM_D_MAX_ATOMS
                     ? malloc(sizeof(double) * (size_t)d->n_atoms * (size_t)d->n_atoms) : NULL;
    if (gd) qf_kv_gram_d(d, gd);
    if (!ci || !e) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv dict: encode %lld vectors: out of memory",
                     (long long)n);
        goto done;
    }
    st = omp_pass(d, gd, x, n, s, tol, true, pool, ci, coef, e, used, false, err);
    if (st) goto done;
    for (int64_t i = 0; i < n * s; i++) idx[i] = ci[i] < 0 ? 0 : (uint16_t)ci[i];
done:
    qf_pool_free(pool);
    free(ci);
    free(e);
    free(gd);
    return st;
}

/* qf_kv_dict_init/free, the Gram matrix, the encoder, qf_kv_dict_decode and the code storage
 * helpers live in src/engine/kv_codes.c: the engine stores and reads codes without the forge. */

/* ---- learning ---- */

/* Sort key for dead-atom replacement: residual descending, index ascending on ties. */
typedef struct {
    double e;
    int64_t i;
} worst_item;

static int worst_cmp(const void *pa, const void *pb) {
    const worst_item *a = pa, *b = pb;
    if (a->e != b->e) return a->e < b->e ? 1 : -1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* One approximate k-SVD sweep (Rubinstein et al. 2008): for each atom in turn, one power
 * step on the residual restricted to the vectors that use it: d = E g / |E g|, g = E^T d.
 * Each step minimises ||E - d g^T|| over one factor, so the training error cannot grow.
 * R (residuals) and the codes are updated in place. Returns atoms nobody uses. */
static int ksvd_update(qf_kv_dict *d, int64_t n, int s, int32_t *idx,
                       float *coef, float *R, int64_t *start, int64_t *users, int *dead) {
    const int A = d->n_atoms, dim = d->head_dim;
    /* inverted index: users of atom a are users[start[a] .. start[a+1]) as i*s + slot, and
     * uvec[p] is that user's vector i (no division in the loops below) */
    int64_t *uvec = users + n * s;
    memset(start, 0, sizeof(int64_t) * (size_t)(A + 1));
    for (int64_t t = 0; t < n * s; t++)
        if (idx[t] >= 0) start[idx[t] + 1]++;
    for (int a = 0; a < A; a++) start[a + 1] += start[a];
    {
        int64_t *fill = malloc(sizeof(int64_t) * (size_t)A);
        if (!fill) return -1;
        memcpy(fill, start, sizeof(int64_t) * (size_t)A);
        for (int64_t t = 0; t < n * s; t++)
            if (idx[t] >= 0) {
                uvec[fill[idx[t]]] = t / s;
                users[fill[idx[t]]++] = t;
            }
        free(fill);
    }
    double *u = malloc(sizeof(double) * (size_t)dim);
    float *old = malloc(sizeof(float) * (size_t)dim);
    if (!u || !old) {
        free(u);
        free(old);
        return -1;
    }
    int n_dead = 0;
    for (int a = 0; a < A; a++) {
        float *da = d->atoms + (size_t)a * dim;
        if (start[a] == start[a + 1]) {
            dead[n_dead++] = a;
            continue;
        }
        memcpy(old, da, sizeof(float) * (size_t)dim);
        for (int t = 0; t < dim; t++) u[t] = 0;
        for (int64_t p = start[a]; p < start[a + 1]; p++) {
            int64_t t = users[p], i = uvec[p];
            const float *r = R + (size_t)i * dim;
            double g = coef[t];
            for (int q = 0; q < dim; q++) u[q] += ((double)r[q] + (double)old[q] * g) * g;
        }
        double nu = 0;
        for (int q = 0; q < dim; q++) nu += u[q] * u[q];
        if (!(nu > 1e-30)) continue; /* all coefficients zero: keep the atom as it is */
        nu = 1.0 / sqrt(nu);
        for (int q = 0; q < dim; q++) da[q] = (float)(u[q] * nu);
        for (int64_t p = start[a]; p < start[a + 1];) {
            /* four users at a time when they are four distinct vectors (always: OMP never picks
             * an atom twice): their sums are independent chains, each in its own order */
            int64_t t4[4], i4[4];
            int m = 0;
            for (; m < 4 && p + m < start[a + 1]; m++) t4[m] = users[p + m], i4[m] = uvec[p + m];
            bool distinct = m == 4;
            for (int x = 0; x < m && distinct; x++)
                for (int y = 0; y < x; y++) distinct &= i4[x] != i4[y];
            if (!distinct) m = 1;
            float *r4[4], g4[4];
            double gn4[4] = {0, 0, 0, 0};
            for (int x = 0; x < m; x++) r4[x] = R + (size_t)i4[x] * dim, g4[x] = coef[t4[x]];
            if (m == 4)
                for (int q = 0; q < dim; q++) {
                    const double o = old[q], dq = da[q];
                    gn4[0] += ((double)r4[0][q] + o * g4[0]) * dq;
                    gn4[1] += ((double)r4[1][q] + o * g4[1]) * dq;
                    gn4[2] += ((double)r4[2][q] + o * g4[2]) * dq;
                    gn4[3] += ((double)r4[3][q] + o * g4[3]) * dq;
                }
            else
                for (int q = 0; q < dim; q++) gn4[0] += ((double)r4[0][q] + (double)old[q] * g4[0]) * da[q];
            for (int x = 0; x < m; x++) {
                float *r = r4[x], g = g4[x], gf = (float)gn4[x];
                for (int q = 0; q < dim; q++) r[q] = r[q] + old[q] * g - da[q] * gf;
                coef[t4[x]] = gf;
            }
            p += m;
        }
    }
    free(u);
    free(old);
    return n_dead;
}

/* Atoms list[0..n) become the worst-represented training vectors (worst[] sorted). */
static void replace_atoms(qf_kv_dict *d, const float *X, const worst_item *worst, int64_t nt,
                          const int *list, int n) {
    const int dim = d->head_dim;
    int64_t w = 0;
    for (int k = 0; k < n && w < nt; w++) {
        if (!(worst[w].e > 0)) break;
        float *da = d->atoms + (size_t)list[k] * dim;
        memcpy(da, X + (size_t)worst[w].i * dim, sizeof(float) * (size_t)dim);
        if (normalize_row(da, dim)) k++;
    }
}

qf_status qf_kv_dict_learn(const float *x, int64_t n, int head_dim, const qf_kv_dict_params *p,
                           qf_kv_dict *out, qf_error *err) {
    memset(out, 0, sizeof *out);
    const int A = p->n_atoms, s = p->sparsity, dim = head_dim;
    if (dim < 1 || A < 1 || A > QF_KV_MAX_ATOMS || s < 1 || s > dim || s > A ||
        s > QF_KV_MAX_SPARSITY || p->iters < 0 || !(p->tol >= 0 && p->tol < 1))
        return qf_fail(err, QF_ERR_ARG,
                       "kv dict learn: n_atoms %d, sparsity %d, head_dim %d, iters %d: expected "
                       "1 <= sparsity <= min(head_dim, n_atoms), n_atoms <= %d, iters >= 0",
                       A, s, dim, p->iters, QF_KV_MAX_ATOMS);
    int64_t nt = n;
    if (p->max_train > 0 && p->max_train < nt) nt = p->max_train;
    qf_status bst = qf_blas_init(1, err); /* OpenBLAS loaded, single-threaded (kernels/blas.h) */
    if (bst) return bst;
    if (nt < A)
        return qf_fail(err, QF_ERR_ARG,
                       "kv dict learn: %lld training vectors: expected at least n_atoms = %d",
                       (long long)nt, A);

    qf_status st = QF_OK;
    float *X = malloc(sizeof(float) * (size_t)nt * dim);
    float *R = malloc(sizeof(float) * (size_t)nt * dim);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)nt * s);
    float *coef = malloc(sizeof(float) * (size_t)nt * s);
    double *e = malloc(sizeof(double) * (size_t)nt);
    int64_t *start = malloc(sizeof(int64_t) * (size_t)(A + 1));
    int64_t *users = malloc(sizeof(int64_t) * (size_t)nt * s * 2);
    int *dead = malloc(sizeof(int) * (size_t)A);
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)nt);
    worst_item *worst = malloc(sizeof(worst_item) * (size_t)nt);
    uint8_t *mark = malloc((size_t)A);
    double *energy = malloc(sizeof(double) * (size_t)A);
    float *sv_atoms = malloc(sizeof(float) * (size_t)A * dim);
    int32_t *sv_idx = malloc(sizeof(int32_t) * (size_t)nt * s);
    float *sv_coef = malloc(sizeof(float) * (size_t)nt * s);
    /* the encoder's Cholesky dots as a table (the same codes; NULL, above QF_KV_GRAM_D_MAX_ATOMS
     * or when out of memory, only means they are computed per vector) */
    double *gram_d = A <= QF_KV_GRAM_D_MAX_ATOMS ? malloc(sizeof(double) * (size_t)A * A) : NULL;
    qf_pool *pool = p->n_threads > 1 ? qf_pool_create(p->n_threads) : NULL;
    out->head_dim = dim;
    out->n_atoms = A;
    out->atoms = malloc(sizeof(float) * (size_t)A * dim);
    out->gram = malloc(sizeof(float) * (size_t)A * A);
    if (!X || !R || !idx || !coef || !e || !start || !users || !dead || !perm || !worst || !mark || !energy || !sv_atoms || !sv_idx || !sv_coef ||
        !out->atoms || !out->gram) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv dict learn: %lld x %d vectors, %d atoms: out of memory",
                     (long long)nt, dim, A);
        goto done;
    }
    for (int64_t i = 0; i < nt; i++) /* evenly strided subsample (all when nt == n) */
        memcpy(X + (size_t)i * dim, x + (size_t)(i * n / nt) * dim, sizeof(float) * (size_t)dim);
    double den = 0;
    for (int64_t i = 0; i < nt * dim; i++) den += (double)X[i] * (double)X[i];
    if (!isfinite(den)) {
        st = qf_fail(err, QF_ERR_ARG, "kv dict learn: vectors: expected finite values");
        goto done;
    }

    /* Initial atoms: distinct training vectors picked by a seeded shuffle; zero vectors
     * are passed over, and a seeded random direction fills in if too few are nonzero. */
    uint64_t rng = p->seed;
    for (int64_t i = 0; i < nt; i++) perm[i] = i;
    int got = 0;
    for (int64_t i = 0; i < nt && got < A; i++) {
        int64_t j = i + (int64_t)(qf_splitmix64(&rng) % (uint64_t)(nt - i));
        int64_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
        float *da = out->atoms + (size_t)got * dim;
        memcpy(da, X + (size_t)perm[i] * dim, sizeof(float) * (size_t)dim);
        if (normalize_row(da, dim)) got++;
    }
    while (got < A) {
        float *da = out->atoms + (size_t)got * dim;
        for (int q = 0; q < dim; q++)
            da[q] = (float)((double)(qf_splitmix64(&rng) >> 11) / 9007199254740992.0 - 0.5);
        if (normalize_row(da, dim)) got++;
    }
    compute_gram(out, gram_d);

    st = omp_pass(out, gram_d, X, nt, s, p->tol, false, pool, idx, coef, e, NULL, false, err);
    if (st) goto done;
    double num = 0;
    for (int64_t i = 0; i < nt; i++) num += e[i];
    if (p->err_trace) p->err_trace[0] = den > 0 ? fmin(num / den, 1.0) : 0;

    bool stalled = false;
    double prev_num = num;
    for (int it = 1; it <= p->iters; it++) {
        /* residuals of the current codes */
        for (int64_t i = 0; i < nt; i++) {
            float *r = R + (size_t)i * dim;
            memcpy(r, X + (size_t)i * dim, sizeof(float) * (size_t)dim);
            for (int j = 0; j < s; j++) {
                int32_t a = idx[(size_t)i * s + j];
                if (a < 0) continue;
                float c = coef[(size_t)i * s + j];
                const float *at = out->atoms + (size_t)a * dim;
                for (int q = 0; q < dim; q++) r[q] -= c * at[q];
            }
        }
        int n_dead = ksvd_update(out, nt, s, idx, coef, R, start, users, dead);
        if (n_dead < 0) {
            st = qf_fail(err, QF_ERR_NOMEM, "kv dict learn: k-SVD scratch: out of memory");
            goto done;
        }
        /* Near-duplicate atoms (|cos| > 0.99) are k-SVD's usual local minimum: the pair
         * shares one direction while some structure goes unrepresented. They are replaced
         * like dead atoms, but their codes lose a slot, so the step is kept only if the
         * recoded error is not above the current one; otherwise only the dead go. */
        compute_gram(out, gram_d);
        memset(mark, 0, (size_t)A);
        for (int k = 0; k < n_dead; k++) mark[dead[k]] = 1;
        int n_rep = n_dead;
        for (int a = 0; a < A; a++) {
            if (mark[a]) continue;
            for (int b2 = 0; b2 < a; b2++)
                if (!mark[b2] && fabsf(out->gram[(size_t)b2 * A + a]) > 0.99f) {
                    mark[a] = 2;
                    dead[n_rep++] = a;
                    break;
                }
        }
        /* When learning stalls (< 1% gain), also try swapping out the least used atoms
         * (smallest sum of squared coefficients): the same accept-or-revert test keeps
         * the error from growing, and it moves atoms stuck on a mixture of directions. */
        if (stalled) {
            for (int a = 0; a < A; a++) energy[a] = mark[a] ? INFINITY : 0;
            for (int64_t t = 0; t < nt * s; t++)
                if (idx[t] >= 0) energy[idx[t]] += (double)coef[t] * coef[t];
            int n_swap = A / 32 > 1 ? A / 32 : 1;
            for (int k = 0; k < n_swap; k++) {
                int lo = -1;
                for (int a = 0; a < A; a++)
                    if (!mark[a] && (lo < 0 || energy[a] < energy[lo])) lo = a;
                if (lo < 0) break;
                mark[lo] = 2;
                dead[n_rep++] = lo;
            }
        }
        double before = 0;
        for (int64_t i = 0; i < nt; i += 4) { /* four independent sums at a time */
            if (i + 4 <= nt) {
                const float *r0 = R + (size_t)i * dim, *r1 = r0 + dim, *r2 = r1 + dim, *r3 = r2 + dim;
                double e0 = 0, e1 = 0, e2 = 0, e3 = 0;
                for (int q = 0; q < dim; q++) {
                    e0 += (double)r0[q] * (double)r0[q];
                    e1 += (double)r1[q] * (double)r1[q];
                    e2 += (double)r2[q] * (double)r2[q];
                    e3 += (double)r3[q] * (double)r3[q];
                }
                worst[i].e = e0, worst[i + 1].e = e1, worst[i + 2].e = e2, worst[i + 3].e = e3;
            } else
                for (int64_t k = i; k < nt; k++) worst[k].e = dot_d(R + (size_t)k * dim, R + (size_t)k * dim, dim);
            for (int64_t k = i; k < nt && k < i + 4; k++) {
                worst[k].i = k;
                before += worst[k].e;
            }
        }
        if (n_rep > 0) qsort(worst, (size_t)nt, sizeof *worst, worst_cmp);
        bool tried_dups = n_rep > n_dead;
        if (tried_dups) {
            memcpy(sv_atoms, out->atoms, sizeof(float) * (size_t)A * dim);
            memcpy(sv_idx, idx, sizeof(int32_t) * (size_t)nt * s);
            memcpy(sv_coef, coef, sizeof(float) * (size_t)nt * s);
            for (int64_t t = 0; t < nt * s; t++)
                if (idx[t] >= 0 && mark[idx[t]] == 2) idx[t] = -1, coef[t] = 0;
            replace_atoms(out, X, worst, nt, dead, n_rep);
            compute_gram(out, gram_d);
            st = omp_pass(out, gram_d, X, nt, s, p->tol, false, pool, idx, coef, e, NULL, true, err);
            if (st) goto done;
            num = 0;
            for (int64_t i = 0; i < nt; i++) num += e[i];
            if (num > before) { /* rejected: back to the updated dictionary */
                memcpy(out->atoms, sv_atoms, sizeof(float) * (size_t)A * dim);
                memcpy(idx, sv_idx, sizeof(int32_t) * (size_t)nt * s);
                memcpy(coef, sv_coef, sizeof(float) * (size_t)nt * s);
                tried_dups = false;
            }
        }
        if (!tried_dups) {
            /* Dead atoms: no code uses them, so the error is unchanged and recoding can
             * only gain. */
            replace_atoms(out, X, worst, nt, dead, n_dead);
            compute_gram(out, gram_d);
            st = omp_pass(out, gram_d, X, nt, s, p->tol, false, pool, idx, coef, e, NULL, true, err);
            if (st) goto done;
            num = 0;
            for (int64_t i = 0; i < nt; i++) num += e[i];
        }
        stalled = num > prev_num * 0.99;
        prev_num = num;
        if (p->err_trace) p->err_trace[it] = den > 0 ? fmin(num / den, 1.0) : 0;
    }

done:
    qf_pool_free(pool);
    free(X);
    free(R);
    free(idx);
    free(coef);
    free(e);
    free(start);
    free(users);
    free(dead);
    free(perm);
    free(worst);
    free(mark);
    free(energy);
    free(sv_atoms);
    free(sv_idx);
    free(sv_coef);
    free(gram_d);
    if (st) qf_kv_dict_free(out);
    return st;
}
