/* kv_codes.c: the engine's KV codecs (declared in include/qforge/kv.h): the dictionary
 * (validation + Gram), the OMP encoder the dict cache runs on every token write, the kv-dict
 * code layouts (V1: byte indices; PACKED: bit-packed indices) and the kv-int8 row quantizer.
 * They live in the engine because the engine runs artifacts without the forge; the forge's
 * learners call these same functions, so what a learner measures is what the cache stores. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_codes.h"
#include "kernels/blas.h"
#include "kernels/gemm.h"
#include "kernels/vecmath.h"
#include "util/util.h"

/* ---- dictionary ---- */

static double dot_d(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

void qf_kv_gram(const float *atoms, int n_atoms, int head_dim, float *gram) {
    qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_atoms, n_atoms, head_dim, 1.0f, atoms,
             head_dim, atoms, head_dim, 0.0f, gram, n_atoms);
}

void qf_kv_dict_free(qf_kv_dict *d) {
    if (!d) return;
    free(d->atoms);
    free(d->gram);
    memset(d, 0, sizeof *d);
}

qf_status qf_kv_dict_init(qf_kv_dict *d, const float *atoms, int n_atoms, int head_dim,
                          qf_error *err) {
    memset(d, 0, sizeof *d);
    if (head_dim < 1 || n_atoms < 1 || n_atoms > QF_KV_MAX_ATOMS || !atoms)
        return qf_fail(err, QF_ERR_ARG,
                       "kv dict: n_atoms %d, head_dim %d: expected 1..%d atoms of >= 1 floats",
                       n_atoms, head_dim, QF_KV_MAX_ATOMS);
    size_t na = (size_t)n_atoms, hd = (size_t)head_dim;
    d->head_dim = head_dim;
    d->n_atoms = n_atoms;
    d->atoms = malloc(sizeof(float) * na * hd);
    d->gram = malloc(sizeof(float) * na * na);
    if (!d->atoms || !d->gram) {
        qf_kv_dict_free(d);
        return qf_fail(err, QF_ERR_NOMEM, "kv dict: %d atoms: out of memory", n_atoms);
    }
    memcpy(d->atoms, atoms, sizeof(float) * na * hd);
    for (size_t a = 0; a < na; a++) {
        float *at = d->atoms + a * hd;
        double nn = dot_d(at, at, head_dim);
        if (!(nn > 1e-30) || !isfinite(nn)) {
            qf_kv_dict_free(d);
            return qf_fail(err, QF_ERR_FORMAT,
                           "kv dict: atom %zu: expected a finite nonzero vector", a);
        }
        float inv = (float)(1.0 / sqrt(nn));
        for (size_t t = 0; t < hd; t++) at[t] *= inv;
    }
    qf_kv_gram(d->atoms, n_atoms, head_dim, d->gram);
    return QF_OK;
}

/* ---- the encoder ---- */

static size_t align8(size_t b) { return (b + 7) & ~(size_t)7; }

size_t qf_kv_omp_scratch_bytes(int n_atoms, int s) {
    if (s > QF_KV_MAX_SPARSITY) s = QF_KV_MAX_SPARSITY;
    return 2 * align8(sizeof(float) * (size_t)n_atoms) + sizeof(double) * ((size_t)s * s + 3 * (size_t)s);
}

size_t qf_kv_omp_scratch_floats(int n_atoms, int s) {
    return (qf_kv_omp_scratch_bytes(n_atoms, s) + 3) / 4;
}

/* a . x in float with 8 partial sums combined in a fixed order: vectorised, deterministic */
static float dot8(const float *restrict a, const float *restrict x, int n) {
    float acc[8] = {0};
    int t = 0;
    for (; t + 8 <= n; t += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[t + u] * x[t + u];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; t < n; t++) s += a[t] * x[t];
    return s;
}

void qf_kv_gram_d(const qf_kv_dict *d, double *gram_d) {
    const int A = d->n_atoms, dim = d->head_dim;
    for (int b = 0; b < A; b++) /* row b: dot_d(atom a, atom b) for every a */
        qf_vec_rows_dot_f64(d->atoms, (size_t)dim, dim, d->atoms + (size_t)b * dim, A, gram_d + (size_t)b * A);
}

/* qf_kv_omp_ex, with the atoms' double dot products read from gram_d when it is not NULL
 * (qf_kv_gram_d's table holds dot_d of every pair: the same values) */
static int omp_core(const qf_kv_dict *d, const double *gram_d, const float *x, const float *alpha0, int s,
                    double tol, void *scratch, uint16_t *idx, float *coef) {
    const int A = d->n_atoms, dim = d->head_dim;
    if (s > QF_KV_MAX_SPARSITY) s = QF_KV_MAX_SPARSITY;
    if (s > A) s = A;
    uint8_t *sb = scratch;
    float *a0 = (float *)sb;
    float *restrict al = (float *)(sb + align8(sizeof(float) * (size_t)A));
    double *L = (double *)(sb + 2 * align8(sizeof(float) * (size_t)A));
    double *cI = L + (size_t)s * s, *y = cI + s, *gam = y + s;
    int sel[QF_KV_MAX_SPARSITY];
    for (int j = 0; j < s; j++) idx[j] = 0, coef[j] = 0;
    double xx = dot_d(x, x, dim);
    if (!(xx > 0) || !isfinite(xx)) return 0;
    if (!alpha0) {
        for (int a = 0; a < A; a++) a0[a] = dot8(d->atoms + (size_t)a * dim, x, dim);
        alpha0 = a0;
    }
    const double stop = QF_KV_OMP_STOP_CORR * sqrt(xx);
    const double bound = tol > 0 ? tol * tol * xx : -1; /* on ||r||^2 */
    double rr = xx;                                     /* ||r||^2 = ||x||^2 - ||y||^2 */
    memcpy(al, alpha0, sizeof(float) * (size_t)A);
    int k = 0;
    while (k < s) {
        /* argmax |alpha| on the bit patterns: for non-NaN floats with the sign bit cleared,
         * integer order is float order, and an integer max vectorises (fixed 8-wide loops) */
        const uint32_t *ab = (const uint32_t *)al;
        uint32_t m8[8] = {0}, mx = 0;
        int a = 0;
        for (; a + 8 <= A; a += 8)
            for (int u = 0; u < 8; u++) {
                uint32_t v = ab[a + u] & 0x7fffffffu;
                m8[u] = v > m8[u] ? v : m8[u];
            }
        for (; a < A; a++) {
            uint32_t v = ab[a] & 0x7fffffffu;
            mx = v > mx ? v : mx;
        }
        for (int u = 0; u < 8; u++) mx = m8[u] > mx ? m8[u] : mx;
        if (mx > 0x7f800000u) break; /* NaN */
        int best = 0;
        while (best < A && (ab[best] & 0x7fffffffu) != mx) best++;
        if (best >= A || !(fabsf(al[best]) > stop)) break; /* the residual is zero */
        bool dup = false;
        for (int j = 0; j < k; j++) dup |= sel[j] == best;
        if (dup) break; /* round-off picked a selected atom: nothing left to gain */
        /* Cholesky row from exact dot products: L[k][0..k) solves L w = D_I^T d_best */
        const float *db = d->atoms + (size_t)best * dim;
        double *Lk = L + (size_t)k * s;
        const double *gb = gram_d ? gram_d + (size_t)best * A : NULL;
        double piv = gb ? gb[best] : dot_d(db, db, dim);
        for (int j = 0; j < k; j++) {
            double g = gb ? gb[sel[j]] : dot_d(d->atoms + (size_t)sel[j] * dim, db, dim);
            for (int m = 0; m < j; m++) g -= L[(size_t)j * s + m] * Lk[m];
            Lk[j] = g / L[(size_t)j * s + j];
            piv -= Lk[j] * Lk[j];
        }
        if (!(piv > QF_KV_OMP_STOP_PIVOT)) break; /* the atom is in the span already */
        Lk[k] = sqrt(piv);
        sel[k] = best;
        cI[k] = dot_d(db, x, dim);
        /* y = L^-1 D_I^T x grows by one entry; gamma = L^-T y */
        double v = cI[k];
        for (int j = 0; j < k; j++) v -= Lk[j] * y[j];
        y[k] = v / Lk[k];
        rr -= y[k] * y[k];
        k++;
        for (int i = k - 1; i >= 0; i--) {
            double g = y[i];
            for (int j = i + 1; j < k; j++) g -= L[(size_t)j * s + i] * gam[j];
            gam[i] = g / L[(size_t)i * s + i];
        }
        if (rr <= bound || k == s) break;
        /* alpha = alpha0 - G[:, I] gamma */
        memcpy(al, alpha0, sizeof(float) * (size_t)A);
        for (int j = 0; j < k; j++) { /* al[b] -= g[b] * gj is al[b] + g[b] * -gj, the same bits */
            const float ngj = -(float)gam[j];
            qf_vec_cols_axpy(d->gram + (size_t)sel[j] * A, 0, 1, &ngj, A, al);
        }
        for (int j = 0; j < k; j++) al[sel[j]] = 0; /* never reselect */
    }
    for (int j = 0; j < k; j++) {
        idx[j] = (uint16_t)sel[j];
        coef[j] = isfinite(gam[j]) ? (float)gam[j] : 0;
    }
    return k;
}

int qf_kv_omp_ex(const qf_kv_dict *d, const float *x, const float *alpha0, int s, double tol,
                 void *scratch, uint16_t *idx, float *coef) {
    return omp_core(d, NULL, x, alpha0, s, tol, scratch, idx, coef);
}

int qf_kv_omp_gd(const qf_kv_dict *d, const double *gram_d, const float *x, const float *alpha0, int s,
                 double tol, void *scratch, uint16_t *idx, float *coef) {
    return omp_core(d, gram_d, x, alpha0, s, tol, scratch, idx, coef);
}

void qf_kv_omp_one(const qf_kv_dict *d, const float *x, int s, float *scratch, uint16_t *idx,
                   float *coef) {
    qf_kv_omp_ex(d, x, NULL, s, 0, scratch, idx, coef);
}

/* ---- kv-dict code storage ---- */

const char *qf_kv_coef_name(qf_kv_coef f) { return f == QF_KV_COEF_Q8 ? "q8" : "f16"; }

int qf_kv_index_bits(int n_atoms) {
    int b = 1;
    while ((1 << b) < n_atoms) b++;
    return b;
}

double qf_kv_code_bits(int n_atoms, int s, qf_kv_coef f) {
    double ib = n_atoms > 1 ? qf_kv_index_bits(n_atoms) : 0;
    return f == QF_KV_COEF_Q8 ? s * (ib + 8) + 16 : s * (ib + 16);
}

static size_t index_bytes(const qf_kv_code_fmt *f) {
    if (f->packed) return ((size_t)f->sparsity * (size_t)qf_kv_index_bits(f->n_atoms) + 7) / 8;
    return (size_t)f->sparsity * (f->n_atoms <= 256 ? 1 : 2);
}

size_t qf_kv_fmt_bytes(const qf_kv_code_fmt *f) {
    size_t s = (size_t)f->sparsity;
    return index_bytes(f) + (f->coef == QF_KV_COEF_Q8 ? s + 2 : s * 2);
}

size_t qf_kv_code_bytes(int n_atoms, int s, qf_kv_coef f) {
    qf_kv_code_fmt fm = {.n_atoms = n_atoms, .sparsity = s, .coef = f};
    return qf_kv_fmt_bytes(&fm);
}

static float q8_scale(const float *coef, int s) {
    float m = 0;
    for (int j = 0; j < s; j++) m = fmaxf(m, fabsf(coef[j]));
    return qf_f16_to_f32(qf_f32_to_f16(m / 127.0f));
}

static int8_t q8_one(float c, float inv) {
    float v = fminf(fmaxf(c * inv, -127.0f), 127.0f);
    return (int8_t)(v + (v >= 0 ? 0.5f : -0.5f));
}

void qf_kv_coef_round(float *coef, int s, qf_kv_coef f) {
    if (f == QF_KV_COEF_F16) {
        for (int j = 0; j < s; j++) coef[j] = qf_f16_to_f32(qf_f32_to_f16(coef[j]));
        return;
    }
    float sc = q8_scale(coef, s);
    float inv = sc > 0 ? 1.0f / sc : 0;
    for (int j = 0; j < s; j++) coef[j] = (float)q8_one(coef[j], inv) * sc;
}

void qf_kv_fmt_pack(const qf_kv_code_fmt *f, const uint16_t *idx, const float *coef,
                    uint8_t *out) {
    const int s = f->sparsity;
    uint8_t *o = out;
    if (f->packed) {
        const int ib = qf_kv_index_bits(f->n_atoms);
        uint32_t acc = 0;
        int nb = 0;
        for (int j = 0; j < s; j++) {
            acc |= (uint32_t)(idx[j] & ((1u << ib) - 1)) << nb;
            nb += ib;
            while (nb >= 8) *o++ = (uint8_t)acc, acc >>= 8, nb -= 8;
        }
        if (nb > 0) *o++ = (uint8_t)acc;
    } else {
        for (int j = 0; j < s; j++) {
            if (f->n_atoms <= 256) {
                *o++ = (uint8_t)idx[j];
            } else {
                *o++ = (uint8_t)(idx[j] & 0xff);
                *o++ = (uint8_t)(idx[j] >> 8);
            }
        }
    }
    if (f->coef == QF_KV_COEF_F16) {
        for (int j = 0; j < s; j++) {
            uint16_t h = qf_f32_to_f16(coef[j]);
            *o++ = (uint8_t)(h & 0xff);
            *o++ = (uint8_t)(h >> 8);
        }
        return;
    }
    float sc = q8_scale(coef, s);
    uint16_t h = qf_f32_to_f16(sc);
    *o++ = (uint8_t)(h & 0xff);
    *o++ = (uint8_t)(h >> 8);
    float inv = sc > 0 ? 1.0f / sc : 0;
    for (int j = 0; j < s; j++) *o++ = (uint8_t)q8_one(coef[j], inv);
}

void qf_kv_code_pack(const uint16_t *idx, const float *coef, int s, int n_atoms, qf_kv_coef f,
                     uint8_t *out) {
    qf_kv_code_fmt fm = {.n_atoms = n_atoms, .sparsity = s, .coef = f};
    qf_kv_fmt_pack(&fm, idx, coef, out);
}

void qf_kv_fmt_slots(const qf_kv_code_fmt *f, int n_atoms, const uint8_t *code, int32_t *idx, float *coef,
                     size_t ld) {
    const int s = f->sparsity;
    QF_ASSERT(s <= QF_KV_MAX_SPARSITY);
    const uint8_t *ci = code;
    const uint8_t *cc = code + index_bytes(f);
    int32_t ia[QF_KV_MAX_SPARSITY];
    float ca[QF_KV_MAX_SPARSITY];
    /* one loop per layout (each vectorizes or at least runs without per-slot branches) */
    if (f->packed) {
        const int ib = qf_kv_index_bits(f->n_atoms);
        uint32_t acc = 0;
        int nb = 0;
        for (int j = 0; j < s; j++) {
            while (nb < ib) acc |= (uint32_t)*ci++ << nb, nb += 8;
            ia[j] = (int32_t)(acc & ((1u << ib) - 1));
            acc >>= ib, nb -= ib;
        }
    } else if (f->n_atoms <= 256) {
        for (int j = 0; j < s; j++) ia[j] = ci[j];
    } else {
        for (int j = 0; j < s; j++) ia[j] = ci[2 * j] | ci[2 * j + 1] << 8;
    }
    if (f->coef == QF_KV_COEF_Q8) {
        const float sc = qf_f16_to_f32((uint16_t)(cc[0] | cc[1] << 8));
        for (int j = 0; j < s; j++) ca[j] = (float)(int8_t)cc[2 + j] * sc;
    } else {
        for (int j = 0; j < s; j++) ca[j] = qf_f16_to_f32((uint16_t)(cc[2 * j] | cc[2 * j + 1] << 8));
    }
    for (int j = 0; j < s; j++) { /* an unused slot, or a corrupt index: index 0, coefficient +0 */
        const bool drop = ia[j] >= n_atoms || ca[j] == 0;
        idx[(size_t)j * ld] = drop ? 0 : ia[j];
        coef[(size_t)j * ld] = drop ? 0.0f : ca[j];
    }
}

void qf_kv_fmt_slots_rows(const qf_kv_code_fmt *f, int n_atoms, const uint8_t *code, size_t stride, int n,
                          int32_t *idx, float *coef, size_t ld) {
    const int s = f->sparsity;
    if (f->packed || f->n_atoms > 256 || f->coef != QF_KV_COEF_F16) {
        for (int r = 0; r < n; r++) qf_kv_fmt_slots(f, n_atoms, code + (size_t)r * stride, idx + r, coef + r, ld);
        return;
    }
    /* V1 byte indices and f16 coefficients (what calibrate writes by default): slot by slot, so each
     * slot's row of the table is written in order, no per-row call */
    for (int j = 0; j < s; j++) {
        int32_t *ij = idx + (size_t)j * ld;
        float *cj = coef + (size_t)j * ld;
        const uint8_t *pi = code + j, *pc = code + s + 2 * j;
        for (int r = 0; r < n; r++) {
            const size_t o = (size_t)r * stride;
            const int32_t a = pi[o];
            const float c = qf_f16_to_f32((uint16_t)(pc[o] | pc[o + 1] << 8));
            const bool drop = a >= n_atoms || c == 0;
            ij[r] = drop ? 0 : a;
            cj[r] = drop ? 0.0f : c;
        }
    }
}

void qf_kv_fmt_decode(const qf_kv_code_fmt *f, const qf_kv_dict *d, const uint8_t *code,
                      float *out) {
    const int s = f->sparsity;
    QF_ASSERT(s <= QF_KV_MAX_SPARSITY);
    int32_t ia[QF_KV_MAX_SPARSITY];
    float ca[QF_KV_MAX_SPARSITY];
    qf_kv_fmt_slots(f, d->n_atoms, code, ia, ca, 1);
    int m = 0;
    for (int j = 0; j < s; j++) /* the kept slots, in slot order */
        if (ca[j] != 0) ia[m] = ia[j], ca[m] = ca[j], m++;
    /* out = sum of c * atom in slot order, each element an f32 product then add from 0 */
    qf_vec_gather_axpy(d->atoms, (size_t)d->head_dim, ia, ca, m, d->head_dim, out);
}

void qf_kv_code_decode(const qf_kv_dict *d, const uint8_t *code, int s, qf_kv_coef f,
                       float *out) {
    qf_kv_code_fmt fm = {.n_atoms = d->n_atoms, .sparsity = s, .coef = f};
    qf_kv_fmt_decode(&fm, d, code, out);
}

void qf_kv_dict_decode(const qf_kv_dict *d, const uint16_t *idx, const float *coef, int s,
                       int64_t n, float *out) {
    const int dim = d->head_dim;
    for (int64_t i = 0; i < n; i++) {
        float *o = out + (size_t)i * dim;
        for (int t = 0; t < dim; t++) o[t] = 0;
        for (int j = 0; j < s; j++) {
            int a = idx[(size_t)i * s + j];
            float c = coef[(size_t)i * s + j];
            if (a >= d->n_atoms || c == 0) continue;
            const float *at = d->atoms + (size_t)a * dim;
            for (int t = 0; t < dim; t++) o[t] += c * at[t];
        }
    }
}

/* ---- kv-int8 row quantizer ---- */

void qf_kv_int8_inv_scale(const float *scale, float *inv, int n) {
    for (int i = 0; i < n; i++) inv[i] = scale[i] != 0 ? 1.0f / scale[i] : 0.0f;
}

/* Written so the compiler vectorises it: fmaxf/fminf also map NaN to -127 (fmaxf returns
 * the non-NaN operand), so the float-to-int conversion is always in range. */
void qf_kv_int8_quantize(const float *x, const float *inv_scale, int8_t *q, int n) {
    for (int i = 0; i < n; i++) {
        float v = fminf(fmaxf(x[i] * inv_scale[i], -127.0f), 127.0f);
        q[i] = (int8_t)(v + (v >= 0 ? 0.5f : -0.5f));
    }
}

void qf_kv_int8_dequantize(const int8_t *q, const float *scale, float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = (float)q[i] * scale[i];
}

/* ---- kv-int8 per-row scale, 8.0 bits per element ----
 * One row (one kv head of one token, n >= 8 elements, n a multiple of 8) is n int8 codes with
 * the row's own step s = 2^((e - 176) / 8). The 8-bit exponent e is not stored beside the row:
 * bit i of e is the parity of the sum of the codes in group i (elements i, i + 8, i + 16, ...).
 * Where a group's parity is wrong, the encoder moves the ONE code of that group that costs the
 * least squared error to its other neighbour (the element whose value lies nearest to halfway
 * between two codes), so carrying the scale costs about 8 % in MSE instead of a byte per row.
 * The encoder tries the step that just avoids clipping and the next smaller one (which may clip
 * the largest element) and keeps the lower total squared error. */
#define TOK_GROUPS 8

/* 2^-22 .. 2^9.9: rows with absmax from ~3e-5 to ~1.2e5 get their exact 1/8-octave step */
static float tok_step(int e) { return exp2f((float)(e - 176) * (1.0f / 8.0f)); }

/* codes for x at exponent e (parities fixed); returns the squared error in units of x */
static double tok_encode(const float *x, int8_t *q, int n, int e) {
    float s = tok_step(e), inv = 1.0f / s;
    int par[TOK_GROUPS] = {0};
    for (int i = 0; i < n; i++) {
        float v = fminf(fmaxf(x[i] * inv, -127.0f), 127.0f); /* fmaxf maps NaN to -127 */
        int c = (int)lrintf(v);
        q[i] = (int8_t)c;
        par[i % TOK_GROUPS] ^= c & 1;
    }
    for (int g = 0; g < TOK_GROUPS; g++) {
        if (par[g] == ((e >> g) & 1)) continue;
        int best = -1, best_c = 0;
        float best_cost = INFINITY;
        for (int i = g; i < n; i += TOK_GROUPS) {
            float v = fminf(fmaxf(x[i] * inv, -127.0f), 127.0f);
            int c = q[i];
            for (int d = -1; d <= 1; d += 2) {
                int c2 = c + d;
                if (c2 < -127 || c2 > 127) continue;
                float cost = (v - (float)c2) * (v - (float)c2) - (v - (float)c) * (v - (float)c);
                if (cost < best_cost) best_cost = cost, best = i, best_c = c2;
            }
        }
        q[best] = (int8_t)best_c; /* a group has >= 1 element and every code has a neighbour in range */
    }
    double err = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)x[i] - (double)q[i] * s;
        err += isfinite(d) ? d * d : 1e300;
    }
    return err;
}

void qf_kv_int8_token_quantize(const float *x, int8_t *q, int n) {
    float amax = 0;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i])); /* fmaxf drops NaN */
    int e = 0;
    if (amax > 0 && isfinite(amax)) {
        e = (int)ceilf(8.0f * log2f(amax / 127.0f)) + 176;
        if (e < 1) e = 1;
        if (e > 255) e = 255;
        while (e < 255 && amax / tok_step(e) > 127.0f) e++; /* log2f rounding */
    }
    double err = tok_encode(x, q, n, e);
    if (e > 0) { /* one step finer: the largest element may clip, the rest gain resolution */
        int8_t alt[1024];
        if (n <= 1024 && tok_encode(x, alt, n, e - 1) < err) memcpy(q, alt, (size_t)n);
    }
}

void qf_kv_int8_token_dequantize(const int8_t *q, float *x, int n) {
    int e = 0;
    for (int i = 0; i < n; i++) e ^= ((uint8_t)q[i] & 1) << (i % TOK_GROUPS);
    float s = tok_step(e);
    for (int i = 0; i < n; i++) x[i] = (float)q[i] * s;
}

/* ---- kv-int8 "ec": an entropy-coded row in exactly 8 bits per element ----
 * At 8 bits per element a fixed-length code has to cover the row's largest element, but a row
 * of a rotated K or V head is close to Gaussian (kurtosis ~2.9 on the demo models), whose
 * values spend ~7.5 bits of information per element at that step. This layout spends all
 * 8 * n bits on a prefix code instead, so the step can be chosen by the row's RMS rather than
 * by its maximum: on the demo models' rotated rows of one head the error is 0.6x (head_dim
 * 128) / 0.7x (head_dim 64) that of the parity-carried layout above; the cache codes the kv
 * heads of one token together in rows of up to 256 elements (kv_cache.c ec_group), 0.89x /
 * 0.94x the error of q8_0 + Hadamard at 8.5 bits (docs/kv-baselines.md has the KLD).
 *
 * Row of n elements in n bytes (n a multiple of 8 in [16, 1024]), one LSB-first bit stream:
 *   10 bits  e: step d = 2^((e - 704) / 32); e = 0: every element is 0
 *   n codes  c = round(|x| / d) in [0, EC_MAX_CODE], then its sign:
 *            prefix of h = c >> 4: h 0 "00", 1 "01", 2 "100", 3 "101" (first bit read first),
 *            4 "110", h >= 5 "111" then (h - 5) ones and a zero (the Huffman code of h for a
 *            Gaussian at this rate: lengths 2 2 3 3 3 4 5 6 ...);
 *            then the 4 low bits of c (LSB first) and one sign bit (1: negative)
 *   the rest zero padding.
 * The encoder picks the finest step whose codes fit (the code length only grows as the step
 * shrinks), so a row far from Gaussian still fits: it only gets a coarser step. */
#define EC_HDR_BITS 10
#define EC_BIAS 704 /* e 1..1023: d = 2^-21.97 .. 2^9.97 (rows of RMS ~1e-4 .. ~6e4 at full precision) */
#define EC_MAX_CODE 1023

/* the step of exponent e (1..1023), as encoder and decoder compute it (float, exact /32) */
static float ec_step(int e) { return exp2f((float)(e - EC_BIAS) * (1.0f / 32.0f)); }

/* bits of one element's code at magnitude c: prefix of h = c >> 4, 4 low bits, sign */
static int ec_code_bits(int c) {
    int h = c >> 4;
    return 5 + (h < 2 ? 2 : h < 5 ? 3 : h - 1);
}

/* magnitude code of x at 1/step inv: round half up, capped at cmax; non-finite x codes as 0 */
static int ec_code_of(float x, float inv, int cmax) {
    float v = fabsf(x) * inv;
    if (!(v < (float)cmax)) return isfinite(x) ? cmax : 0; /* non-finite elements code as 0 */
    int c = (int)(v + 0.5f);
    return c > cmax ? cmax : c;
}

/* total bits of the row at exponent e, codes capped at cmax */
static long ec_row_bits(const float *x, int n, int e, int cmax) {
    float inv = 1.0f / ec_step(e);
    long b = EC_HDR_BITS;
    for (int i = 0; i < n; i++) b += ec_code_bits(ec_code_of(x[i], inv, cmax));
    return b;
}

typedef struct {
    uint8_t *p;
    size_t pos; /* bits written */
} ec_writer;

/* append the nb low bits of v, LSB first (the row was zeroed: only ones are written) */
static void ec_put(ec_writer *w, uint32_t v, int nb) {
    for (int k = 0; k < nb; k++, w->pos++)
        if ((v >> k) & 1) w->p[w->pos >> 3] |= (uint8_t)(1u << (w->pos & 7));
}

void qf_kv_int8_ec_quantize(const float *x, uint8_t *q, int n) {
    memset(q, 0, (size_t)n);
    double ss = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) ss += (double)x[i] * x[i];
    if (!(ss > 0) || !isfinite(ss)) return; /* e = 0: the zero row */
    const long budget = 8L * n;
    int cmax = EC_MAX_CODE;
    /* start near the step the rate gives a Gaussian row (~57 steps per RMS), then walk */
    double e0 = EC_BIAS + ceil(32.0 * log2(sqrt(ss / n) / 57.0));
    int e = e0 < 1 ? 1 : e0 > 1023 ? 1023 : (int)e0;
    if (ec_row_bits(x, n, e, cmax) <= budget) {
        while (e > 1 && ec_row_bits(x, n, e - 1, cmax) <= budget) e--;
    } else {
        while (e < 1023 && ec_row_bits(x, n, e, cmax) > budget) e++;
        /* beyond the step range (|x| ~1e6): cap the codes; 15 always fits (7 bits each) */
        while (cmax > 15 && ec_row_bits(x, n, e, cmax) > budget) cmax = cmax > 30 ? cmax / 2 : 15;
    }
    float inv = 1.0f / ec_step(e);
    ec_writer w = {q, 0};
    ec_put(&w, (uint32_t)e, EC_HDR_BITS);
    for (int i = 0; i < n; i++) {
        int c = ec_code_of(x[i], inv, cmax), h = c >> 4;
        if (h < 2) ec_put(&w, (uint32_t)(h << 1), 2); /* "0", then h */
        else if (h < 5) ec_put(&w, 1u | (uint32_t)((h - 2) & 1) << 1 | (uint32_t)((h - 2) >> 1) << 2, 3);
        else {
            ec_put(&w, 7u, 3);
            for (int k = 5; k < h; k++) ec_put(&w, 1u, 1);
            ec_put(&w, 0u, 1);
        }
        ec_put(&w, (uint32_t)(c & 15), 4);
        ec_put(&w, x[i] < 0 && c ? 1u : 0u, 1);
    }
}

/* The decoder: qf_kv_int8_ec_dequantize_ref's bit stream and values. Each element is decoded
 * from the 64-bit window at its first bit (ec_fast_one: its prefix, unary tail, low bits and
 * sign by shifts, a count of trailing ones and no branch on the code); from the first element
 * that does not end inside the window and the row on (a long tail, a corrupt row), the
 * reference's steps finish the row (ec_continue). Every decode step of a kv-int8 ec cache reads
 * every row, so this is its CPU decode's inner loop; qf_kv_int8_ec_dequantize4 runs four rows'
 * chains side by side, which the serial dependency of one row's elements leaves room for, and
 * qf_kv_int8_ec_dequantize16 16 or 32 in AVX-512 lanes (kv_codes_avx512.c), each lane's rare
 * long code or row end by ec_fast_one (qf_kv_int8_ec_one) and what it cannot take by
 * ec_continue. */

/* Every element code of at most EC_TAB_BITS bits (h <= 6: all but the rarest), by its first
 * EC_TAB_BITS bits: c (bits 0-9), the sign (bit 10) and the code's length (bits 11-15); length
 * 0 where the code is longer. Built once (pthread_once). */
#define EC_TAB_BITS 11
static uint16_t ec_tab[1 << EC_TAB_BITS];
static pthread_once_t ec_tab_once = PTHREAD_ONCE_INIT;
static void ec_tab_build(void) {
    for (unsigned w = 0; w < (1u << EC_TAB_BITS); w++) {
        unsigned h, len;
        if (!(w & 1)) h = (w >> 1) & 1, len = 2;
        else if ((w & 7) != 7) h = 2 + ((w >> 1) & 3), len = 3;
        else {
            unsigned ones = 0;
            while (3 + ones < EC_TAB_BITS && (w >> (3 + ones)) & 1) ones++;
            h = 5 + ones, len = 4 + ones; /* the tail's zero may lie past the table's bits: checked below */
        }
        if (len + 5 > EC_TAB_BITS || (h >= 5 && 3 + (h - 5) >= EC_TAB_BITS)) {
            ec_tab[w] = 0;
            continue;
        }
        const unsigned c = h << 4 | ((w >> len) & 15), sg = (w >> (len + 4)) & 1;
        ec_tab[w] = (uint16_t)(c | sg << 10 | (len + 5) << 11);
    }
}

/* one element at bit *pp of the row q[0, n) with step d into *out, when it ends inside the
 * 8-byte window at its first byte and inside the row: true, *pp advanced; else false */
static inline bool ec_fast_one(const uint8_t *q, size_t n, size_t *pp, float d, float *out) {
    const size_t pos = *pp, at = pos >> 3;
    if (at >= n) return false;
    const size_t left = n - at;
    uint64_t w = 0; /* little endian: bit k of the stream is bit k of w */
    int lim = 57;   /* the element must end within the window's bits and the row's */
    if (left >= 8) memcpy(&w, q + at, 8);
    else memcpy(&w, q + at, left), lim = 8 * (int)left - (int)(pos & 7);
    w >>= pos & 7;
    const unsigned t = ec_tab[w & ((1u << EC_TAB_BITS) - 1)], tl = t >> 11;
    if (tl && (int)tl <= lim) { /* the common case: one table entry */
        *pp = pos + tl;
        float v = (float)(t & 1023) * d;
        uint32_t vb;
        memcpy(&vb, &v, 4), vb ^= (uint32_t)(t >> 10 & 1) << 31, memcpy(out, &vb, 4);
        return true;
    }
    /* the prefix by its first 3 bits (bit 0 read first), without branches (a branch on random
     * codes costs more than the rest): bit 0 = 0: h = bit 1, 2 bits; else h = 2 + bits 1-2, 3
     * bits; h = 5 ("111"): plus the unary tail's ones and its zero */
    const unsigned p3 = (unsigned)w & 7, b0 = p3 & 1, hb = p3 >> 1;
    const int ones = __builtin_ctzll(~(w >> 3)), tail = p3 == 7;
    const uint32_t h = tail ? 5 + (uint32_t)ones : b0 ? 2 + hb : hb & 1;
    const int len = tail ? 4 + ones : 2 + (int)b0;
    if (len + 5 > lim) return false; /* past the window or the row */
    const uint32_t lo = (uint32_t)(w >> len) & 15, sg = (uint32_t)(w >> (len + 4)) & 1;
    *pp = pos + (size_t)len + 5;
    float v = (float)(h << 4 | lo) * d;
    uint32_t vb;
    memcpy(&vb, &v, 4), vb ^= sg << 31, memcpy(out, &vb, 4); /* -v when sg, without a branch */
    return true;
}

/* elements [i, n_out) of the row from bit pos (a nonzero step d), one bit at a time: the
 * reference's steps; the elements a corrupt row leaves undecoded are 0 */
static void ec_bits_from(const uint8_t *q, int n, float *x, int n_out, int i, size_t pos, float d) {
    const size_t total = (size_t)n * 8;
    size_t next = pos >> 3; /* the buffer from pos on */
    uint64_t buf = 0;
    int have = 0;
    if (pos & 7) {
        buf = (uint64_t)(next < (size_t)n ? q[next] : 0) >> (pos & 7);
        have = 8 - (int)(pos & 7), next++;
    }
#define EC_NEED(k)                                                                                 \
    while (have < (k)) {                                                                           \
        buf |= (uint64_t)(next < (size_t)n ? q[next] : 0) << have;                                 \
        next++, have += 8;                                                                         \
    }
#define EC_TAKE(k, out)                                                                            \
    do {                                                                                           \
        EC_NEED(k);                                                                                \
        out = (uint32_t)(buf & ((1u << (k)) - 1));                                                 \
        buf >>= (k), have -= (k), pos += (k);                                                      \
    } while (0)
    for (; i < n_out; i++) {
        uint32_t h, b;
        EC_TAKE(1, b);
        if (!b) EC_TAKE(1, h);
        else {
            EC_TAKE(2, h);
            h += 2;
            if (h == 5) /* the unary tail; a run past the row's end is a corrupt row */
                for (;;) {
                    EC_TAKE(1, b);
                    if (!b || pos > total) break;
                    h++;
                }
        }
        uint32_t lo, sg;
        EC_TAKE(4, lo);
        EC_TAKE(1, sg);
        if (pos > total) break; /* only a corrupt row runs out of bits */
        float v = (float)(h << 4 | lo) * d;
        x[i] = sg ? -v : v;
    }
#undef EC_NEED
#undef EC_TAKE
    for (; i < n_out; i++) x[i] = 0;
}

/* elements [i, n_out) of the row from bit pos (a nonzero step d): fast while they fit, then the
 * reference's steps */
static void ec_continue(const uint8_t *q, int n, float *x, int n_out, int i, size_t pos, float d) {
    for (; i < n_out && ec_fast_one(q, (size_t)n, &pos, d, x + i); i++) {
    }
    ec_bits_from(q, n, x, n_out, i, pos, d);
}

/* the row's 10-bit exponent (n >= 16 bytes by the layout's contract; 0 for a shorter row) */
static uint32_t ec_header(const uint8_t *q, int n) {
    return n >= 2 ? ((uint32_t)q[0] | (uint32_t)q[1] << 8) & ((1u << EC_HDR_BITS) - 1) : 0;
}

/* one row: the header, then every element 0 (e = 0) or decoded from bit EC_HDR_BITS on, one bit
 * at a time (the reference) or fast while the elements fit the window */
static void ec_row(const uint8_t *q, int n, float *x, int n_out, bool fast) {
    if (n_out > n) n_out = n;
    const uint32_t e = ec_header(q, n);
    if (!e) { /* every element is 0 */
        for (int i = 0; i < n_out; i++) x[i] = 0;
        return;
    }
    if (fast) ec_continue(q, n, x, n_out, 0, EC_HDR_BITS, ec_step((int)e));
    else ec_bits_from(q, n, x, n_out, 0, EC_HDR_BITS, ec_step((int)e));
}

/* the decoder one bit at a time: the reference for qf_kv_int8_ec_dequantize */
void qf_kv_int8_ec_dequantize_ref(const uint8_t *q, int n, float *x, int n_out) { ec_row(q, n, x, n_out, false); }

void qf_kv_int8_ec_dequantize(const uint8_t *q, int n, float *x, int n_out) {
    pthread_once(&ec_tab_once, ec_tab_build);
    ec_row(q, n, x, n_out, true);
}

bool qf_kv_int8_ec_one(const uint8_t *q, int n, uint32_t *pos, float d, float *out) {
    size_t p = *pos;
    const bool ok = ec_fast_one(q, (size_t)n, &p, d, out);
    *pos = (uint32_t)p;
    return ok;
}

bool qf_kv_int8_ec16_fast(void) { return qf_gemm_isa_get() == QF_GEMM_ISA_AVX512; }

/* the nr (<= 32) rows' headers at q, stride bytes apart: each row's step into d[r]; bit r of the
 * result set where row r is not all zeros (its exponent is not 0) */
static uint32_t ec_headers(const uint8_t *q, size_t stride, int n, int nr, float *d) {
    uint32_t live = 0;
    for (int r = 0; r < nr; r++) {
        const uint32_t e = ec_header(q + r * stride, n);
        d[r] = e ? ec_step((int)e) : 0.0f;
        live |= (uint32_t)(e != 0) << r;
    }
    return live;
}

/* row values src[from, to) (src NULL: zeros) to their places in a segmented row x (see
 * qf_kv_int8_ec_dequantize16_seg), those before skip dropped */
static void ec_seg_put(float *x, const float *src, int from, int to, int skip, int seg, size_t sstride) {
    for (int i = from > skip ? from : skip; i < to; i++)
        x[(size_t)((i - skip) / seg) * sstride + (size_t)((i - skip) % seg)] = src ? src[i] : 0.0f;
}

/* the 16 / 32-row AVX-512 kernels apply to nr rows of n bytes, stride bytes apart: the CPU has
 * them, rows of 16 elements or more, row offsets within int32 (else the four-row route) */
static bool ec16_ok(int n, int nr, size_t stride) {
    return qf_kv_int8_ec16_fast() && n >= 16 && stride <= (size_t)(INT32_MAX - n) / (size_t)(nr - 1);
}
/* rows r .. r + 3 at q (stride bytes apart) decoded into ro (qf_kv_int8_ec_dequantize4) */
static void ec_decode4_at(const uint8_t *q, size_t stride, int r, int n, float *const ro[4], int n_out) {
    const uint8_t *rq[4] = {q + r * stride, q + (r + 1) * stride, q + (r + 2) * stride, q + (r + 3) * stride};
    qf_kv_int8_ec_dequantize4(rq, n, ro, n_out);
}

void qf_kv_int8_ec_dequantize16_seg(const uint8_t *q, size_t stride, int n, int nr, float *const *x, int n_out, int skip,
                                    int seg, size_t sstride) {
    pthread_once(&ec_tab_once, ec_tab_build);
    if (n_out > n) n_out = n;
    QF_ASSERT(nr == 16 || nr == 32);
    QF_ASSERT(skip >= 0 && seg >= 1);
    /* one segment from element 0: x[r][i], the rows written in place */
    const bool flat = skip == 0 && n_out <= seg;
    QF_ASSERT(flat || n_out <= QF_KV_EC_SEG_MAX);
    float tmp[4][QF_KV_EC_SEG_MAX]; /* scratch rows where x is not flat */
    const bool kernel_ok = skip % 16 == 0 && (seg % 16 == 0 || n_out - skip <= seg);
    if (!ec16_ok(n, nr, stride) || !kernel_ok) {
        for (int r = 0; r < nr; r += 4) { /* four at a time */
            if (flat) {
                float *const ro[4] = {x[r], x[r + 1], x[r + 2], x[r + 3]};
                ec_decode4_at(q, stride, r, n, ro, n_out);
            } else {
                float *const ro[4] = {tmp[0], tmp[1], tmp[2], tmp[3]};
                ec_decode4_at(q, stride, r, n, ro, n_out);
                for (int k = 0; k < 4; k++) ec_seg_put(x[r + k], tmp[k], 0, n_out, skip, seg, sstride);
            }
        }
        return;
    }
    float d[32];
    const uint32_t live = ec_headers(q, stride, n, nr, d);
    int at[32];
    uint32_t pos[32];
    const int kseg = flat ? INT32_MAX : seg;
    if (nr == 32) qf_kv_int8_ec_run32_avx512(q, stride, n, d, live, EC_HDR_BITS, n_out, x, skip, kseg, sstride, at, pos);
    else qf_kv_int8_ec_run16_avx512(q, stride, n, d, live, EC_HDR_BITS, n_out, x, skip, kseg, sstride, at, pos);
    for (int r = 0; r < nr; r++) {
        if (!(live >> r & 1)) { /* e = 0: every element is 0 */
            if (flat)
                for (int i = 0; i < n_out; i++) x[r][i] = 0;
            else ec_seg_put(x[r], NULL, 0, n_out, skip, seg, sstride);
        } else if (at[r] < n_out) {
            if (flat) ec_continue(q + r * stride, n, x[r], n_out, at[r], pos[r], d[r]);
            else {
                ec_continue(q + r * stride, n, tmp[0], n_out, at[r], pos[r], d[r]);
                ec_seg_put(x[r], tmp[0], at[r], n_out, skip, seg, sstride);
            }
        }
    }
}

/* row r's dot products (one decoded row of nseg seg floats): see qf_kv_int8_ec_dot16. Compiled
 * without contraction (C11): a product, then a sum, in order from 0. */
static void ec_dot_row(const float *row, int r, int nseg, int seg, const float *qv, int nq, size_t qstride, float *y,
                       size_t ystride) {
    for (int k = 0; k < nseg; k++)
        for (int i = 0; i < nq; i++) {
            const float *a = row + (size_t)k * seg, *b = qv + (size_t)(k * nq + i) * qstride;
            float acc = 0;
            for (int e = 0; e < seg; e++) acc += a[e] * b[e];
            y[(size_t)(k * nq + i) * ystride + (size_t)r] = acc;
        }
}

void qf_kv_int8_ec_dot_ref(const uint8_t *q, size_t stride, int n, int nr, int nseg, int seg, const float *qv, int nq,
                           size_t qstride, float *y, size_t ystride) {
    const int n_out = nseg * seg;
    QF_ASSERT(nseg >= 1 && seg >= 1 && n_out <= n && n_out <= QF_KV_EC_SEG_MAX);
    float row[QF_KV_EC_SEG_MAX];
    for (int r = 0; r < nr; r++) {
        qf_kv_int8_ec_dequantize_ref(q + (size_t)r * stride, n, row, n_out);
        ec_dot_row(row, r, nseg, seg, qv, nq, qstride, y, ystride);
    }
}

void qf_kv_int8_ec_dot16(const uint8_t *q, size_t stride, int n, int nr, int nseg, int seg, const float *qv, int nq,
                         size_t qstride, float *y, size_t ystride) {
    pthread_once(&ec_tab_once, ec_tab_build);
    const int n_out = nseg * seg;
    QF_ASSERT(nr == 16 || nr == 32);
    QF_ASSERT(nseg >= 1 && seg >= 1 && n_out <= n && n_out <= QF_KV_EC_SEG_MAX && nq >= 1 && nq <= QF_KV_EC_DOT_MAXQ);
    float tmp[4][QF_KV_EC_SEG_MAX];
    if (!ec16_ok(n, nr, stride) || seg % 16) {
        float *const ro[4] = {tmp[0], tmp[1], tmp[2], tmp[3]};
        for (int r = 0; r < nr; r += 4) { /* four rows at a time, then their chains */
            ec_decode4_at(q, stride, r, n, ro, n_out);
            for (int k = 0; k < 4; k++) ec_dot_row(tmp[k], r + k, nseg, seg, qv, nq, qstride, y, ystride);
        }
        return;
    }
    float d[32];
    const uint32_t live = ec_headers(q, stride, n, nr, d);
    int at[32];
    uint32_t pos[32];
    if (nr == 32) qf_kv_int8_ec_dot32_avx512(q, stride, n, d, live, EC_HDR_BITS, n_out, seg, qv, nq, qstride, y, ystride, at, pos);
    else qf_kv_int8_ec_dot16_avx512(q, stride, n, d, live, EC_HDR_BITS, n_out, seg, qv, nq, qstride, y, ystride, at, pos);
    for (int r = 0; r < nr; r++)
        if (!(live >> r & 1) || at[r] < n_out) { /* a zero row, or one the lanes left: decoded whole */
            qf_kv_int8_ec_dequantize(q + r * stride, n, tmp[0], n_out);
            ec_dot_row(tmp[0], r, nseg, seg, qv, nq, qstride, y, ystride);
        }
}

/* row r's weighted elements (one decoded row, elements [from, nseg seg)) into y: see
 * qf_kv_int8_ec_wsum16 */
static void ec_wsum_row(const float *row, int r, int from, int nseg, int seg, const float *w, int nq, size_t wstride,
                        float *y, size_t ystride) {
    for (int k = 0; k < nseg; k++)
        for (int i = 0; i < nq; i++) {
            const float wi = w[(size_t)(k * nq + i) * wstride + (size_t)r];
            float *yo = y + (size_t)(k * nq + i) * ystride;
            for (int e = from > k * seg ? from - k * seg : 0; e < seg; e++) yo[e] += wi * row[(size_t)k * seg + e];
        }
}

void qf_kv_int8_ec_wsum_ref(const uint8_t *q, size_t stride, int n, int nr, int nseg, int seg, const float *w, int nq,
                            size_t wstride, float *y, size_t ystride) {
    const int n_out = nseg * seg;
    QF_ASSERT(nseg >= 1 && seg >= 1 && n_out <= n && n_out <= QF_KV_EC_SEG_MAX);
    float row[QF_KV_EC_SEG_MAX];
    for (int r = 0; r < nr; r++) {
        qf_kv_int8_ec_dequantize_ref(q + (size_t)r * stride, n, row, n_out);
        ec_wsum_row(row, r, 0, nseg, seg, w, nq, wstride, y, ystride);
    }
}

void qf_kv_int8_ec_wsum_fold(float *acc, int nseg, int seg, int nq, float *y, size_t ystride) {
    for (int o = 0; o < nseg * nq; o++)
        for (int e = 0; e < seg; e++) {
            float *a = acc + ((size_t)o * seg + (size_t)e) * 16, s = 0;
            for (int l = 0; l < 16; l++) s += a[l], a[l] = 0;
            y[(size_t)o * ystride + (size_t)e] += s;
        }
}

void qf_kv_int8_ec_wsum16(const uint8_t *q, size_t stride, int n, int nr, int nseg, int seg, const float *w, int nq,
                          size_t wstride, float *acc, float *y, size_t ystride) {
    pthread_once(&ec_tab_once, ec_tab_build);
    const int n_out = nseg * seg;
    QF_ASSERT(nr == 16 || nr == 32);
    QF_ASSERT(nseg >= 1 && seg >= 1 && n_out <= n && n_out <= QF_KV_EC_SEG_MAX && nq >= 1 && nq <= QF_KV_EC_DOT_MAXQ);
    float tmp[4][QF_KV_EC_SEG_MAX];
    if (!ec16_ok(n, nr, stride) || seg % 16) {
        float *const ro[4] = {tmp[0], tmp[1], tmp[2], tmp[3]};
        for (int r = 0; r < nr; r += 4) { /* four rows at a time, then their sums */
            ec_decode4_at(q, stride, r, n, ro, n_out);
            for (int k = 0; k < 4; k++) ec_wsum_row(tmp[k], r + k, 0, nseg, seg, w, nq, wstride, y, ystride);
        }
        return;
    }
    float d[32];
    const uint32_t live = ec_headers(q, stride, n, nr, d);
    int at[32];
    uint32_t pos[32];
    if (nr == 32) qf_kv_int8_ec_wsum32_avx512(q, stride, n, d, live, EC_HDR_BITS, n_out, seg, w, nq, wstride, acc, at, pos);
    else qf_kv_int8_ec_wsum16_avx512(q, stride, n, d, live, EC_HDR_BITS, n_out, seg, w, nq, wstride, acc, at, pos);
    for (int r = 0; r < nr; r++)
        if (live >> r & 1 && at[r] < n_out) { /* a row the lanes left: the rest of it (a zero row adds nothing) */
            ec_continue(q + r * stride, n, tmp[0], n_out, at[r], pos[r], d[r]);
            ec_wsum_row(tmp[0], r, at[r], nseg, seg, w, nq, wstride, y, ystride);
        }
}

void qf_kv_int8_ec_dequantize16(const uint8_t *q, size_t stride, int n, int nr, float *const *x, int n_out) {
    qf_kv_int8_ec_dequantize16_seg(q, stride, n, nr, x, n_out, 0, INT32_MAX, 0);
}

void qf_kv_int8_ec_dequantize4(const uint8_t *const q[4], int n, float *const x[4], int n_out) {
    pthread_once(&ec_tab_once, ec_tab_build);
    if (n_out > n) n_out = n;
    const uint32_t e0 = ec_header(q[0], n), e1 = ec_header(q[1], n), e2 = ec_header(q[2], n), e3 = ec_header(q[3], n);
    if (!e0 || !e1 || !e2 || !e3) {
        for (int r = 0; r < 4; r++) qf_kv_int8_ec_dequantize(q[r], n, x[r], n_out);
        return;
    }
    const float d0 = ec_step((int)e0), d1 = ec_step((int)e1), d2 = ec_step((int)e2), d3 = ec_step((int)e3);
    size_t p0 = EC_HDR_BITS, p1 = EC_HDR_BITS, p2 = EC_HDR_BITS, p3 = EC_HDR_BITS;
    int i = 0, i0, i1, i2, i3;
    for (;; i++) { /* four independent chains per step, until one row leaves the fast path */
        if (i == n_out) {
            i0 = i1 = i2 = i3 = i;
            break;
        }
        const bool o0 = ec_fast_one(q[0], (size_t)n, &p0, d0, x[0] + i), o1 = ec_fast_one(q[1], (size_t)n, &p1, d1, x[1] + i),
                   o2 = ec_fast_one(q[2], (size_t)n, &p2, d2, x[2] + i), o3 = ec_fast_one(q[3], (size_t)n, &p3, d3, x[3] + i);
        if (!(o0 && o1 && o2 && o3)) {
            i0 = i + o0, i1 = i + o1, i2 = i + o2, i3 = i + o3;
            break;
        }
    }
    ec_continue(q[0], n, x[0], n_out, i0, p0, d0);
    ec_continue(q[1], n, x[1], n_out, i1, p1, d1);
    ec_continue(q[2], n, x[2], n_out, i2, p2, d2);
    ec_continue(q[3], n, x[3], n_out, i3, p3, d3);
}
