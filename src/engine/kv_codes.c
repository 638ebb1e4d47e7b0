/* kv_codes.c: the KV code formats the engine stores and reads, shared with the forge's
 * learners (declared in include/qforge/kvlearn.h): the kv-dict code layout (atom indices +
 * f16 or 8-bit coefficients: pack, decode, sizes), the engine's per-vector OMP encoder used
 * when a dict-mode cache writes a token, and the kv-int8 row quantizer. They live in the
 * engine because the engine runs artifacts without the forge (src/engine never calls
 * src/forge); the forge's learners call them from here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_codes.h"
#include "util/util.h"

/* ---- kv-dict code storage ---- */

const char *qf_kv_coef_name(qf_kv_coef f) { return f == QF_KV_COEF_Q8 ? "q8" : "f16"; }

static int index_bits(int n_atoms) {
    int b = 0;
    while ((1 << b) < n_atoms) b++;
    return b;
}

double qf_kv_code_bits(int n_atoms, int s, qf_kv_coef f) {
    double ib = index_bits(n_atoms);
    return f == QF_KV_COEF_Q8 ? s * (ib + 8) + 16 : s * (ib + 16);
}

size_t qf_kv_code_bytes(int n_atoms, int s, qf_kv_coef f) {
    size_t ib = n_atoms <= 256 ? 1 : 2;
    return (size_t)s * ib + (f == QF_KV_COEF_Q8 ? (size_t)s + 2 : (size_t)s * 2);
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

void qf_kv_code_pack(const uint16_t *idx, const float *coef, int s, int n_atoms, qf_kv_coef f,
                     uint8_t *out) {
    uint8_t *o = out;
    for (int j = 0; j < s; j++) {
        if (n_atoms <= 256) {
            *o++ = (uint8_t)idx[j];
        } else {
            *o++ = (uint8_t)(idx[j] & 0xff);
            *o++ = (uint8_t)(idx[j] >> 8);
        }
    }
    if (f == QF_KV_COEF_F16) {
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

void qf_kv_code_decode(const qf_kv_dict *d, const uint8_t *code, int s, qf_kv_coef f,
                       float *out) {
    const int dim = d->head_dim;
    const uint8_t *ci = code;
    const uint8_t *cc = code + (size_t)s * (d->n_atoms <= 256 ? 1 : 2);
    float sc = 0;
    if (f == QF_KV_COEF_Q8) {
        sc = qf_f16_to_f32((uint16_t)(cc[0] | cc[1] << 8));
        cc += 2;
    }
    for (int t = 0; t < dim; t++) out[t] = 0;
    for (int j = 0; j < s; j++) {
        int a = d->n_atoms <= 256 ? ci[j] : (ci[2 * j] | ci[2 * j + 1] << 8);
        float c = f == QF_KV_COEF_Q8 ? (float)(int8_t)cc[j] * sc
                                     : qf_f16_to_f32((uint16_t)(cc[2 * j] | cc[2 * j + 1] << 8));
        if (a >= d->n_atoms || c == 0) continue; /* a corrupt index decodes to nothing */
        const float *at = d->atoms + (size_t)a * dim;
        for (int t = 0; t < dim; t++) out[t] += c * at[t];
    }
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

/* ---- the engine's encoder ---- */

void qf_kv_gram(const float *atoms, int n_atoms, int head_dim, float *gram) {
    for (int i = 0; i < n_atoms; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0;
            const float *a = atoms + (size_t)i * head_dim, *b = atoms + (size_t)j * head_dim;
            for (int t = 0; t < head_dim; t++) s += (double)a[t] * b[t];
            gram[(size_t)i * n_atoms + j] = gram[(size_t)j * n_atoms + i] = (float)s;
        }
}

size_t qf_kv_omp_scratch_floats(int n_atoms, int s) {
    return 2 * (size_t)n_atoms + (size_t)s * s + 3 * (size_t)s;
}

void qf_kv_omp_one(const qf_kv_dict *d, const float *x, int s, float *scratch, uint16_t *idx,
                   float *coef) {
    const int na = d->n_atoms, dim = d->head_dim;
    float *alpha0 = scratch, *alpha = scratch + na, *L = alpha + na, *c = L + (size_t)s * s,
          *w = c + s, *y = w + s;
    int sel[64];
    if (s > 64) s = 64; /* head_dim bounds s; the forge never learns s > 64 */
    for (int j = 0; j < s; j++) idx[j] = 0, coef[j] = 0;
    double xx = 0;
    for (int t = 0; t < dim; t++) xx += (double)x[t] * x[t];
    if (!(xx > 0) || !isfinite(xx)) return;
    for (int a = 0; a < na; a++) {
        const float *at = d->atoms + (size_t)a * dim;
        double v = 0;
        for (int t = 0; t < dim; t++) v += (double)at[t] * x[t];
        alpha0[a] = alpha[a] = (float)v;
    }
    int k = 0;
    for (; k < s; k++) {
        int best = -1;
        float bv = 0;
        for (int a = 0; a < na; a++) {
            float v = fabsf(alpha[a]);
            if (v > bv) {
                bool used = false;
                for (int j = 0; j < k; j++) used |= sel[j] == a;
                if (!used) bv = v, best = a;
            }
        }
        if (best < 0 || !(bv > 1e-12f * (float)sqrt(xx))) break;
        /* extend the Cholesky factor of G[sel, sel] by the new atom */
        if (k > 0) {
            for (int i = 0; i < k; i++) {
                double v = d->gram[(size_t)sel[i] * na + best];
                for (int j = 0; j < i; j++) v -= (double)L[i * s + j] * w[j];
                w[i] = (float)(v / L[i * s + i]);
            }
            double ww = 0;
            for (int i = 0; i < k; i++) ww += (double)w[i] * w[i];
            double diag = d->gram[(size_t)best * na + best] - ww;
            if (diag <= 1e-6) break; /* the atom is (nearly) in the span already */
            for (int i = 0; i < k; i++) L[k * s + i] = w[i];
            L[k * s + k] = (float)sqrt(diag);
        } else {
            L[0] = sqrtf(d->gram[(size_t)best * na + best]);
        }
        sel[k] = best;
        /* c = (L L^T)^-1 alpha0[sel] */
        for (int i = 0; i <= k; i++) {
            double v = alpha0[sel[i]];
            for (int j = 0; j < i; j++) v -= (double)L[i * s + j] * y[j];
            y[i] = (float)(v / L[i * s + i]);
        }
        for (int i = k; i >= 0; i--) {
            double v = y[i];
            for (int j = i + 1; j <= k; j++) v -= (double)L[j * s + i] * c[j];
            c[i] = (float)(v / L[i * s + i]);
        }
        /* alpha = alpha0 - G[:, sel] c */
        for (int a = 0; a < na; a++) {
            double v = alpha0[a];
            for (int i = 0; i <= k; i++) v -= (double)d->gram[(size_t)a * na + sel[i]] * c[i];
            alpha[a] = (float)v;
        }
    }
    for (int j = 0; j < k; j++) idx[j] = (uint16_t)sel[j], coef[j] = isfinite(c[j]) ? c[j] : 0;
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
