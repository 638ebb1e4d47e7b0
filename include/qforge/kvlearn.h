/* qforge/kvlearn.h: the KV-cache learners and the sparse-dictionary go/no-go.
 *
 * Pure numeric code over captured KV vectors: float arrays of `head_dim` floats, per layer
 * and per stream (K or V). Vectors are in capture order: token-major, kv-head-minor, so
 * vector i belongs to kv-head i % n_kv_head (the layout of one token's K or V projection).
 *
 *   kv-dict  a per-(layer, stream) dictionary of unit-norm atoms learned with k-SVD over
 *            batch OMP; a vector is stored as s atom indices + s coefficients.
 *   kv-int8  static int8 scales calibrated from captured vectors and the row quantizer the
 *            engine's int8 KV mode calls on every token.
 *   analysis the go/no-go (does a learned dictionary beat plain quantization at the same bit
 *            rate?) plus a rate-distortion table and its SVG plot.
 *
 * All errors are relative MSE: sum ||x - x^||^2 / sum ||x||^2, clamped to [0, 1].
 * Every result is deterministic for a seed and independent of the thread count. */
#ifndef QFORGE_KVLEARN_H
#define QFORGE_KVLEARN_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qforge/error.h"
#include "qforge/kv.h" /* the engine's codecs: dictionary, OMP encoder, code layouts, int8 rows */

/* sum||x - xr||^2 / sum||x||^2 over n floats, clamped to [0, 1]; 0 when x is all zero and
 * xr matches it. */
QF_API double qf_rel_mse(const float *x, const float *xr, int64_t n);

/* ================================ kv-dict ================================ */

typedef struct {
    int n_atoms;       /* 256; in [sparsity, QF_KV_MAX_ATOMS] and <= training vectors */
    int sparsity;      /* 8; nonzeros per code (the cap), in [1, min(head_dim, 64)] */
    double tol;        /* 0; > 0: error-bounded codes (qf_kv_omp_ex), ||r|| <= tol ||x|| */
    int iters;         /* 20 k-SVD iterations */
    uint64_t seed;     /* 1; picks the initial atoms */
    int n_threads;     /* 1; any value gives bit-identical results */
    int64_t max_train; /* 0 = all vectors; else an evenly strided subsample of this size */
    /* Optional out, iters+1 entries: training relative error of the codes in use after
     * the initial coding (entry 0) and after each iteration. Never increases. */
    double *err_trace;
} qf_kv_dict_params;

QF_API void qf_kv_dict_params_default(qf_kv_dict_params *p);

/* Learn a dictionary from n vectors x[n][head_dim]. Unused atoms are replaced each
 * iteration by the worst-represented training vectors. Fills *out (free with
 * qf_kv_dict_free). Fails with QF_ERR_ARG on bad parameters or too few vectors. */
QF_API qf_status qf_kv_dict_learn(const float *x, int64_t n, int head_dim, const qf_kv_dict_params *p,
                           qf_kv_dict *out, qf_error *err);

/* OMP-encode n vectors with s atoms each: idx[n][s], coef[n][s] (f32, not yet rounded to
 * the storage format). A vector that needs fewer atoms gets idx 0 / coef 0 in the unused
 * slots. n_threads as above. Cost per vector ~ n_atoms*(head_dim + s*s) flops. */
QF_API qf_status qf_kv_dict_encode(const qf_kv_dict *d, const float *x, int64_t n, int s, int n_threads,
                            uint16_t *idx, float *coef, qf_error *err);
/* The same with an error bound (qf_kv_omp_ex's tol; 0 = none); used[n] (or NULL) gets the
 * atoms each code uses. Every code is exactly what the engine's dict cache stores for the
 * vector (the engine's encoder, correlations computed by the encoder). */
QF_API qf_status qf_kv_dict_encode_ex(const qf_kv_dict *d, const float *x, int64_t n, int s, double tol,
                               int n_threads, uint16_t *idx, float *coef, uint8_t *used,
                               qf_error *err);

/* ================================ kv-int8 ================================ */

typedef enum {
    QF_KV_SCALE_PER_CHANNEL = 0, /* one scale per (layer, kv-head, channel) */
    QF_KV_SCALE_PER_HEAD = 1,    /* one scale per head slot (layer, kv-head) */
} qf_kv_scale_mode;

/* Fit static int8 scales for one layer and stream from n captured vectors (capture order,
 * see the top of this file). The clip value is the `percentile` (in (0, 100]; 100 =
 * absmax) of |x| over each channel's (or head's) values; scale = clip / 127.
 * scale[n_kv_head * head_dim] is always written per channel (a per-head scale is repeated)
 * so the quantizer below needs no mode. n must be a positive multiple of n_kv_head. */
QF_API qf_status qf_kv_int8_fit(const float *x, int64_t n, int n_kv_head, int head_dim,
                         qf_kv_scale_mode mode, double percentile, float *scale, qf_error *err);

/* The row quantizer the engine calls (qf_kv_int8_quantize and friends) is in qforge/kv.h. */

/* ===================== baselines (rate-distortion references) ===================== */

/* Round trips: write the reconstruction of x[n][dim] to out (may equal x). bits in [2, 8].
 * Bits per element including scale overhead are returned by the matching *_bits(). */
/* Symmetric per-vector absmax, levels +-(2^(bits-1) - 1), one f16 scale per vector. */
QF_API void qf_kv_rt_uniform(const float *x, int64_t n, int dim, int bits, float *out);
QF_API double qf_kv_bits_uniform(int dim, int bits);
/* The same after an orthonormal Walsh-Hadamard rotation (dim must be a power of two). */
QF_API qf_status qf_kv_rt_hadamard(const float *x, int64_t n, int dim, int bits, float *out,
                            qf_error *err);
/* KIVI-style per channel: asymmetric min/max over groups of `group` consecutive tokens of
 * one kv-head, 2^bits levels, f16 scale + f16 zero per channel per group. */
QF_API void qf_kv_rt_per_channel(const float *x, int64_t n, int dim, int n_kv_head, int group, int bits,
                          float *out);
QF_API double qf_kv_bits_per_channel(int group, int bits);

/* ================================ analysis ================================ */

/* What the capture stage hands over: per layer, K and V vectors in capture order. */
typedef struct {
    int n_layer, n_kv_head, head_dim;
    const float *const *k; /* k[l]: n_k[l] vectors of head_dim (NULL or 0 = not captured) */
    const float *const *v;
    const int64_t *n_k, *n_v;
} qf_kv_capture_view;

#define QF_KV_RD_MAX_POINTS 8
#define QF_KV_RD_MAX_CURVES 8
#define QF_KV_RD_MAX_BITS 8

typedef struct {
    char name[32]; /* "uniform", "hadamard", "per-channel", "dict-f16", ... */
    int n;
    double bits[QF_KV_RD_MAX_POINTS + QF_KV_RD_MAX_BITS]; /* per element, overheads included */
    double err[QF_KV_RD_MAX_POINTS + QF_KV_RD_MAX_BITS];  /* relative MSE */
    char label[QF_KV_RD_MAX_POINTS + QF_KV_RD_MAX_BITS][16]; /* "4b", "256/8" */
} qf_kv_rd_curve;

typedef struct {
    char title[64];
    int n_curves;
    qf_kv_rd_curve curves[QF_KV_RD_MAX_CURVES];
} qf_kv_rd_table;

typedef struct {
    int layer;
    char stream; /* 'K' or 'V' */
    int64_t n_vectors, n_train, n_eval;
    /* int8 incumbent: per-vector absmax (one f16 scale per vector), and the engine's static calibrated
     * per-(kv-head, channel) scales. Context, not the gate. */
    double recon_int8, int8_bits; /* bits per vector */
    double recon_int8_static;
    /* the dictionary: error on the evaluation vectors (held out unless holdout_every = 0)
     * and on its training vectors, with coefficients rounded to the storage format */
    double recon_dict, recon_dict_train, dict_code_bits;
    /* the matched-rate gate (go): uniform per-vector quantization at round(code bits / head_dim)
     * bits (clamped 2..8); GO when the dictionary's error is not above it */
    int matched_bits;
    double recon_uniform_matched;
    bool go;
    /* the stricter gate: the best baseline point (any method, 2..8 bits, overheads counted)
     * whose rate does not exceed the dictionary's; the cheapest point if none is that cheap */
    char best_baseline[48];
    double best_baseline_bits, recon_best_baseline;
    bool go_strict;
    double seconds;
    qf_kv_rd_table rd; /* filled when the params ask for a sweep */
} qf_kv_layer_verdict;

typedef struct {
    int head_dim, n_kv_head, n_layer;
    int n_atoms, sparsity;
    qf_kv_coef coef;
    int n_layers;
    qf_kv_layer_verdict *layers;
    bool overall_go;        /* majority rule: GO iff at least half the pairs are GO */
    bool overall_go_strict; /* the same majority over go_strict */
    /* whole-model KV bytes per token (all layers, K and V, all kv heads) */
    double f16_bytes_per_token, int8_bytes_per_token, dict_bytes_per_token;
    qf_kv_rd_table rd_all; /* the sweep pooled over all analysed pairs */
    double seconds;
} qf_kv_report;

typedef struct {
    int n_atoms, sparsity, iters; /* the go/no-go dictionary: 256 atoms, sparsity 4, 20 iterations */
    qf_kv_coef coef;              /* F16 (the code bits count 16 bits per coefficient) */
    int layer_stride;             /* 1: every layer; 2: every other one ... */
    int holdout_every;            /* 8: every 8th vector is held out to evaluate; 0 = in-sample
                                     (learn and evaluate on all vectors) */
    int64_t max_train;            /* 4096; 0 = all training vectors, else a strided subsample */
    uint64_t seed;
    int n_threads;
    /* rate-distortion sweep: (atoms, sparsity) points, learned with rd_iters iterations;
     * (the go/no-go point, if listed, is reused); n_rd = 0 skips the sweep (baselines are
     * always measured: the strict gate needs them) */
    int n_rd;
    int rd_atoms[QF_KV_RD_MAX_POINTS], rd_sparsity[QF_KV_RD_MAX_POINTS];
    int rd_iters;
    int kivi_group; /* 64 tokens per per-channel scale group */
} qf_kv_analysis_params;

QF_API void qf_kv_analysis_params_default(qf_kv_analysis_params *p);

/* Run the go/no-go (and the sweep) over a capture. Pairs with fewer than max(n_atoms, 16)
 * vectors are skipped (too few to learn from). Fails when no pair could be analysed. */
QF_API qf_status qf_kv_analyze(const qf_kv_capture_view *cap, const qf_kv_analysis_params *p,
                        qf_kv_report *out, qf_error *err);
QF_API void qf_kv_report_free(qf_kv_report *r);
/* A plain-text table of the verdicts and the pooled sweep. */
QF_API void qf_kv_report_print(const qf_kv_report *r, FILE *fp);

/* Plot a rate-distortion table: x = bits per element, y = relative MSE (log scale), one
 * polyline per curve, legend. Plain SVG, written atomically. */
QF_API qf_status qf_kv_rd_write_svg(const qf_kv_rd_table *t, const char *path, qf_error *err);

#endif
