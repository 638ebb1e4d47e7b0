/* learn_kv_dict.c: the kv-dict learner: batch OMP (Cholesky-updated) and approximate
 * k-SVD, plus the code storage formats (indices + f16 or 8-bit coefficients).
 *
 * Determinism: each vector's code depends only on the vector, the dictionary and the
 * correlations X*D^T (cblas_sgemm over fixed chunks of vectors), so the
 * thread count only changes who computes which vector. Sums are taken in vector order on
 * the calling thread. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

void qf_kv_dict_free(qf_kv_dict *d) {
    if (!d) return;
    free(d->atoms);
    free(d->gram);
    memset(d, 0, sizeof *d);
}

static void compute_gram(qf_kv_dict *d) {
    qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d->n_atoms, d->n_atoms, d->head_dim, 1.0f,
                d->atoms, d->head_dim, d->atoms, d->head_dim, 0.0f, d->gram, d->n_atoms);
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

qf_status qf_kv_dict_init(qf_kv_dict *d, const float *atoms, int n_atoms, int head_dim,
                          qf_error *err) {
    memset(d, 0, sizeof *d);
    if (qf_blas_init(1, err)) return err ? err->code : QF_ERR_NOMEM;
    if (head_dim < 1 || n_atoms < 1 || n_atoms > QF_KV_MAX_ATOMS)
        return qf_fail(err, QF_ERR_ARG,
                       "kv dict: n_atoms %d, head_dim %d: expected 1..%d atoms of >= 1 floats",
                       n_atoms, head_dim, QF_KV_MAX_ATOMS);
    d->head_dim = head_dim;
    d->n_atoms = n_atoms;
    d->atoms = malloc(sizeof(float) * (size_t)n_atoms * (size_t)head_dim);
    d->gram = malloc(sizeof(float) * (size_t)n_atoms * (size_t)n_atoms);
    if (!d->atoms || !d->gram) {
        qf_kv_dict_free(d);
        return qf_fail(err, QF_ERR_NOMEM, "kv dict: %d atoms: out of memory", n_atoms);
    }
    memcpy(d->atoms, atoms, sizeof(float) * (size_t)n_atoms * (size_t)head_dim);
    for (int a = 0; a < n_atoms; a++) {
        if (!normalize_row(d->atoms + (size_t)a * head_dim, head_dim)) {
            qf_kv_dict_free(d);
            return qf_fail(err, QF_ERR_FORMAT,
                           "kv dict: atom %d: expected a finite nonzero vector", a);
        }
    }
    compute_gram(d);
    return QF_OK;
}

/* ---- batch OMP for one vector ----
 * Atom selection uses the float correlations alpha = alpha0 - G[:,I] gamma; the
 * coefficients are solved in double from exact dot products, so an exactly sparse signal
 * is recovered to ~1e-12 rather than to float round-off. Returns atoms used (<= s);
 * unused slots get idx -1, coef 0. */
typedef struct {
    double *L;    /* [s][s] lower Cholesky factor of G_II */
    double *c;    /* [s] D_I^T x */
    double *gam;  /* [s] */
    double *tmp;  /* [s] */
    float *alpha; /* [n_atoms] */
} omp_scratch;

static bool omp_scratch_alloc(omp_scratch *w, int s, int n_atoms) {
    w->L = malloc(sizeof(double) * (size_t)s * (size_t)s);
    w->c = malloc(sizeof(double) * (size_t)s * 3);
    w->alpha = malloc(sizeof(float) * (size_t)n_atoms);
    if (!w->L || !w->c || !w->alpha) return false;
    w->gam = w->c + s;
    w->tmp = w->c + 2 * s;
    return true;
}

static void omp_scratch_free(omp_scratch *w) {
    free(w->L);
    free(w->c);
    free(w->alpha);
}

static int omp_one(const qf_kv_dict *d, const float *x, const float *alpha0, int s, omp_scratch *w,
                   int32_t *idx, float *coef) {
    const int A = d->n_atoms, dim = d->head_dim;
    double xx = dot_d(x, x, dim);
    double stop = 1e-6 * sqrt(xx); /* below float noise of alpha: the residual is zero */
    memcpy(w->alpha, alpha0, sizeof(float) * (size_t)A);
    int k = 0;
    for (; k < s; k++) {
        /* argmax |alpha| on the bit patterns: for non-NaN floats with the sign bit
         * cleared, integer order is float order, and an integer max vectorises. */
        const uint32_t *ab = (const uint32_t *)w->alpha;
        /* (fixed 8-wide inner loops: gcc -O2 vectorises only constant trip counts) */
        uint32_t m8[8] = {0}, mx = 0;
        int a0 = 0;
        for (; a0 + 8 <= A; a0 += 8)
            for (int u = 0; u < 8; u++) {
                uint32_t v = ab[a0 + u] & 0x7fffffffu;
                m8[u] = v > m8[u] ? v : m8[u];
            }
        for (; a0 < A; a0++) {
            uint32_t v = ab[a0] & 0x7fffffffu;
            mx = v > mx ? v : mx;
        }
        for (int u = 0; u < 8; u++) mx = m8[u] > mx ? m8[u] : mx;
        int best = 0;
        while (best < A && (ab[best] & 0x7fffffffu) != mx) best++;
        float bv = fabsf(w->alpha[best < A ? best : 0]);
        if (best >= A || !(bv > stop) || mx > 0x7f800000u) break; /* zero residual or NaN */
        bool dup = false;
        for (int j = 0; j < k; j++) dup |= idx[j] == best;
        if (dup) break; /* round-off picked an atom already in: nothing left to gain */
        /* Cholesky row: L[k][0..k) solves L w = G_I,best; the pivot is 1 - |w|^2. */
        const float *db = d->atoms + (size_t)best * dim;
        double *Lk = w->L + (size_t)k * s;
        double piv = dot_d(db, db, dim);
        for (int j = 0; j < k; j++) {
            double g = dot_d(d->atoms + (size_t)idx[j] * dim, db, dim);
            for (int m = 0; m < j; m++) g -= w->L[(size_t)j * s + m] * Lk[m];
            Lk[j] = g / w->L[(size_t)j * s + j];
            piv -= Lk[j] * Lk[j];
        }
        if (!(piv > 1e-10)) break; /* the new atom is (nearly) in the span of the others */
        Lk[k] = sqrt(piv);
        idx[k] = best;
        w->c[k] = dot_d(db, x, dim);
        /* gamma = (L L^T)^-1 c over the k+1 selected atoms */
        int m1 = k + 1;
        for (int i = 0; i < m1; i++) {
            double v = w->c[i];
            for (int j = 0; j < i; j++) v -= w->L[(size_t)i * s + j] * w->tmp[j];
            w->tmp[i] = v / w->L[(size_t)i * s + i];
        }
        for (int i = m1 - 1; i >= 0; i--) {
            double v = w->tmp[i];
            for (int j = i + 1; j < m1; j++) v -= w->L[(size_t)j * s + i] * w->gam[j];
            w->gam[i] = v / w->L[(size_t)i * s + i];
        }
        float *restrict al = w->alpha;
        memcpy(al, alpha0, sizeof(float) * (size_t)A);
        for (int j = 0; j < m1; j++) {
            const float *restrict g = d->gram + (size_t)idx[j] * A;
            float gj = (float)w->gam[j];
            int a = 0;
            for (; a + 8 <= A; a += 8)
                for (int u = 0; u < 8; u++) al[a + u] -= g[a + u] * gj;
            for (; a < A; a++) al[a] -= g[a] * gj;
        }
        for (int j = 0; j < m1; j++) w->alpha[idx[j]] = 0; /* never reselect */
    }
    for (int j = 0; j < k; j++) coef[j] = (float)w->gam[j];
    for (int j = k; j < s; j++) idx[j] = -1, coef[j] = 0;
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

/* ---- a parallel OMP pass over n vectors ----
 * Vectors go in fixed chunks of corr_rows() (the same for any thread count, so each
 * vector's correlations come out of an identical sgemm call). The chunk keeps
 * rows*atoms*dim at or under OpenBLAS's single-thread threshold (65536*4): its own threads
 * would otherwise spin in sched_yield against our pool for the second core. */
static int corr_rows(int n_atoms, int dim) {
    int r = (int)(262144 / ((int64_t)n_atoms * dim));
    return r < 1 ? 1 : r > 64 ? 64 : r;
}

typedef struct {
    const qf_kv_dict *d;
    const float *x;
    int64_t n;
    int s;
    int32_t *idx;
    float *coef;
    double *err;      /* per vector squared residual of the new code */
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
    omp_scratch w;
    int32_t *ni = malloc(sizeof(int32_t) * (size_t)s);
    float *nc = malloc(sizeof(float) * (size_t)s);
    float *r = malloc(sizeof(float) * (size_t)dim);
    float *corr = malloc(sizeof(float) * (size_t)rows * A);
    if (!omp_scratch_alloc(&w, s, A) || !ni || !nc || !r || !corr) {
        jb->oom = true; /* distinct threads only ever set it to true */
        goto done;
    }
    for (int64_t c = c_lo; c < c_hi; c++) {
        int64_t lo = c * rows, hi = lo + rows < jb->n ? lo + rows : jb->n;
        qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(hi - lo), A, dim, 1.0f,
                    jb->x + (size_t)lo * dim, dim, d->atoms, dim, 0.0f, corr, A);
        for (int64_t i = lo; i < hi; i++) {
            const float *x = jb->x + (size_t)i * dim;
            int32_t *ci = jb->idx + (size_t)i * s;
            float *cc = jb->coef + (size_t)i * s;
            omp_one(d, x, corr + (size_t)(i - lo) * A, s, &w, ni, nc);
            double e_new = code_err(d, x, ni, nc, s, r);
            if (jb->keep_better) {
                double e_old = code_err(d, x, ci, cc, s, r);
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
    omp_scratch_free(&w);
    free(ni);
    free(nc);
    free(r);
    free(corr);
}

/* Code all n vectors; err[i] gets each squared residual. */
static qf_status omp_pass(const qf_kv_dict *d, const float *x, int64_t n, int s, qf_pool *pool,
                          int32_t *idx, float *coef, double *err, bool keep_better,
                          qf_error *e) {
    omp_job jb = {d, x, n, s, idx, coef, err, keep_better, false};
    qf_pool_run(pool, omp_worker, &jb);
    if (jb.oom) return qf_fail(e, QF_ERR_NOMEM, "kv dict: OMP scratch: out of memory");
    return QF_OK;
}

static qf_status check_dims(const qf_kv_dict *d, int s, qf_error *err) {
    if (!d || !d->atoms || !d->gram)
        return qf_fail(err, QF_ERR_ARG, "kv dict: dictionary: expected an initialised dictionary");
    if (s < 1 || s > d->head_dim || s > d->n_atoms)
        return qf_fail(err, QF_ERR_ARG,
                       "kv dict: sparsity %d: expected 1..min(head_dim %d, n_atoms %d)", s,
                       d->head_dim, d->n_atoms);
    return QF_OK;
}

qf_status qf_kv_dict_encode(const qf_kv_dict *d, const float *x, int64_t n, int s, int n_threads,
                            uint16_t *idx, float *coef, qf_error *err) {
    qf_status st = check_dims(d, s, err);
    if (st) return st;
    if (n <= 0) return QF_OK;
    int32_t *ci = malloc(sizeof(int32_t) * (size_t)n * (size_t)s);
    double *e = malloc(sizeof(double) * (size_t)n);
    qf_pool *pool = n_threads > 1 && n >= 64 ? qf_pool_create(n_threads) : NULL;
    if (!ci || !e) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv dict: encode %lld vectors: out of memory",
                     (long long)n);
        goto done;
    }
    st = omp_pass(d, x, n, s, pool, ci, coef, e, false, err);
    if (st) goto done;
    for (int64_t i = 0; i < n * s; i++) idx[i] = ci[i] < 0 ? 0 : (uint16_t)ci[i];
done:
    qf_pool_free(pool);
    free(ci);
    free(e);
    return st;
}

/* qf_kv_dict_decode, the code storage helpers (qf_kv_code_*) and qf_kv_coef_* live in
 * src/engine/kv_codes.c: the engine stores and reads codes without the forge. */

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
    /* inverted index: users of atom a are users[start[a] .. start[a+1]) as i*s + slot */
    memset(start, 0, sizeof(int64_t) * (size_t)(A + 1));
    for (int64_t t = 0; t < n * s; t++)
        if (idx[t] >= 0) start[idx[t] + 1]++;
    for (int a = 0; a < A; a++) start[a + 1] += start[a];
    {
        int64_t *fill = malloc(sizeof(int64_t) * (size_t)A);
        if (!fill) return -1;
        memcpy(fill, start, sizeof(int64_t) * (size_t)A);
        for (int64_t t = 0; t < n * s; t++)
            if (idx[t] >= 0) users[fill[idx[t]]++] = t;
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
            int64_t t = users[p], i = t / s;
            const float *r = R + (size_t)i * dim;
            double g = coef[t];
            for (int q = 0; q < dim; q++) u[q] += ((double)r[q] + (double)old[q] * g) * g;
        }
        double nu = 0;
        for (int q = 0; q < dim; q++) nu += u[q] * u[q];
        if (!(nu > 1e-30)) continue; /* all coefficients zero: keep the atom as it is */
        nu = 1.0 / sqrt(nu);
        for (int q = 0; q < dim; q++) da[q] = (float)(u[q] * nu);
        for (int64_t p = start[a]; p < start[a + 1]; p++) {
            int64_t t = users[p], i = t / s;
            float *r = R + (size_t)i * dim;
            float g = coef[t];
            double gn = 0;
            for (int q = 0; q < dim; q++) gn += ((double)r[q] + (double)old[q] * g) * da[q];
            float gf = (float)gn;
            for (int q = 0; q < dim; q++) r[q] = r[q] + old[q] * g - da[q] * gf;
            coef[t] = gf;
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
    if (qf_blas_init(1, err)) return err ? err->code : QF_ERR_NOMEM;
    const int A = p->n_atoms, s = p->sparsity, dim = head_dim;
    if (dim < 1 || A < 1 || A > QF_KV_MAX_ATOMS || s < 1 || s > dim || s > A || p->iters < 0)
        return qf_fail(err, QF_ERR_ARG,
                       "kv dict learn: n_atoms %d, sparsity %d, head_dim %d, iters %d: expected "
                       "1 <= sparsity <= min(head_dim, n_atoms), n_atoms <= %d, iters >= 0",
                       A, s, dim, p->iters, QF_KV_MAX_ATOMS);
    int64_t nt = n;
    if (p->max_train > 0 && p->max_train < nt) nt = p->max_train;
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
    int64_t *users = malloc(sizeof(int64_t) * (size_t)nt * s);
    int *dead = malloc(sizeof(int) * (size_t)A);
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)nt);
    worst_item *worst = malloc(sizeof(worst_item) * (size_t)nt);
    uint8_t *mark = malloc((size_t)A);
    double *energy = malloc(sizeof(double) * (size_t)A);
    float *sv_atoms = malloc(sizeof(float) * (size_t)A * dim);
    int32_t *sv_idx = malloc(sizeof(int32_t) * (size_t)nt * s);
    float *sv_coef = malloc(sizeof(float) * (size_t)nt * s);
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
    compute_gram(out);

    st = omp_pass(out, X, nt, s, pool, idx, coef, e, false, err);
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
        compute_gram(out);
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
        for (int64_t i = 0; i < nt; i++) {
            const float *r = R + (size_t)i * dim;
            worst[i].e = dot_d(r, r, dim);
            worst[i].i = i;
            before += worst[i].e;
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
            compute_gram(out);
            st = omp_pass(out, X, nt, s, pool, idx, coef, e, true, err);
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
            compute_gram(out);
            st = omp_pass(out, X, nt, s, pool, idx, coef, e, true, err);
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
    if (st) qf_kv_dict_free(out);
    return st;
}
