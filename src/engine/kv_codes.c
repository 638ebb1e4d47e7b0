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
