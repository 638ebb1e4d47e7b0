/* qforge/kv_rq.h: the kv-rq learner (src/forge/learn_kv_rq.c; docs/kv-rq.md).
 *
 * kv-rq stores every KV row as a per-row half scale plus 2-, 3- or 4-bit codes of a Lloyd-Max
 * codebook, after centring, signed per-channel scaling (K smoothing) and a Walsh-Hadamard
 * rotation (row layout: src/format/kv_rq_row.h); the first n_sink and the last n_window tokens
 * are also kept in f16 (the KV cache's exact sink/window facility). The learner fits, from the
 * captured K and V vectors, per (layer, stream, kv head): the mean, the signed channel scales
 * and a codebook for each bit width; the pipeline then measures each (layer, stream)'s
 * sensitivity and allocates bits greedily (qf_kv_rq_allocate).
 *
 * Payload ("kv-rq" artifacts; L layers, H kv heads, D head_dim):
 *   "format" int 2 (1 is still read), "rotation" string "hadamard", "n_sink" int, "n_window" int,
 *   "k_prerope" int 0/1     (format 2) K rows stored before RoPE, rotated on read (KVQuant):
 *                           the mean and channel scales are then static per channel
 *   "k_bits", "v_bits"      u8  [L]           1..6 (format 1: 2..6; 16 = kept as f16)
 *   "k_levels", "v_levels"  f32 [L, H, 64]    ascending, first 2^bits used
 *   "k_mean", "v_mean"      f32 [L, H, D]
 *   "k_cs", "v_cs"          f32 [L, H, D]     signed channel scales, finite and nonzero
 *   "v_pred"                f32 [L, H*D, H*D] (format 2, optional; needs k_prerope 1) V of a token is
 *                           v_pred[l] . k^ + the decoded V row, k^ the token's decoded K rows
 *                           (all kv heads, before RoPE): the V rows code the residual */
#ifndef QFORGE_KV_RQ_H
#define QFORGE_KV_RQ_H

#include <stdint.h>

#include "qforge/api.h"

#include "qforge/artifact.h"
#include "qforge/error.h"
#include "qforge/kvlearn.h"

#define QF_KV_RQ_FORMAT 2   /* 1: bits 2..6, K after RoPE; 2: adds 1-bit rows and "k_prerope" */
#define QF_KV_RQ_N_WIDTHS 6 /* 1, 2, 3, 4, 5 and 6 bits */

typedef struct {
    double k_alpha;    /* K channel smoothing: cs_c = rms_c^alpha (geometric mean 1); 0 = off */
    double v_alpha;    /* the same for V (default 0) */
    int lloyd_iters;   /* per fit (default 60) */
    int64_t max_rows;  /* rows per (layer, stream, head) used to fit (0 = all captured) */
    uint64_t seed;     /* the random signs of the rotation */
    /* Optional importance of each channel's error, [L][H][D] per stream (NULL = uniform): for K
     * the mean squared query that multiplies it, for V the squared norm of the output-projection
     * column it feeds. The channel scales then minimize the weighted error: cs_c = (rms_c /
     * sqrt(w_c))^alpha (alpha 0.5 is the optimum after the rotation spreads the error evenly). */
    const float *chan_w[2];
    /* V predicted from the same layer's dequantized pre-RoPE K (both are linear in the layer's
     * normed input): a ridge fit per layer (inputs with relative noise v_pred_noise, default
     * 0.2), V's codebooks then fit the residual. Needs K captured before RoPE. */
    bool v_pred;
    double v_pred_noise;
    /* Threads for the fits (0 or 1: the caller's only). The fit is bit-identical for any count. */
    int n_threads;
    /* Run the dense double-precision steps on the CUDA device: the V predictor's Gram sums,
     * triangular solves and residual, and V minus its prediction (here and in
     * qf_kv_rq_learn_klt). The fit is bit-identical to the CPU's; QF_ERR_DEVICE without a GPU
     * (ask qf_cuda_available first). Default false. */
    bool gpu;
} qf_kv_rq_learn_params;

QF_API void qf_kv_rq_learn_params_default(qf_kv_rq_learn_params *p);

/* Everything learned for one model: [stream][layer][head] blocks, codebooks for 2..6 bits,
 * and per (stream, layer, width) the relative reconstruction MSE on the fitting rows. */
typedef struct {
    int n_layer, n_kv_head, head_dim;
    float *mean[2], *cs[2];                   /* [L][H][D] */
    float *levels[2][QF_KV_RQ_N_WIDTHS];      /* [L][H][64] */
    double *rel_mse[2];                       /* [L][QF_KV_RQ_N_WIDTHS] */
    bool k_prerope;                           /* K was captured before RoPE (set by the caller;
                                                 written to the payload as "k_prerope") */
    float *v_pred;                            /* [L][H*D][H*D] or NULL: V ~ v_pred . K (all heads) */
    double *v_pred_ratio;                     /* [L] residual / total V variance (1 = unused) */
    struct qf_kv_rq_klt_fit *klt;             /* format 3 (qf_kv_rq_learn_klt) or NULL */
} qf_kv_rq_fit;

/* Format 3 (src/forge/learn_kv_rq_klt.c, row codec src/engine/kv_rq_klt.h): transform coding.
 * Per (layer, stream, kv head) the principal axes R of M (x - mean) (x: pre-RoPE K, or V minus
 * its prediction from K), M the square root of the metric the attention sees (K: diagonal, the
 * mean squared query energy of each RoPE pair; V: the Gram matrix of the attn_output columns
 * the head feeds; identity without weights); enc = R^T M, dec = M^-1 R; per coordinate a
 * Lloyd-Max codebook at each width 1..6 on the standardized, row-scaled coordinate; per unit
 * rate (e/8 bits per element, e = 4..48: whole bits, or a layer bit value 32 + e) the widths of
 * the coordinates by greedy reverse water-filling of e * head_dim / 8 bits on the measured
 * per-coordinate distortions. Payload, format 3 (with the
 * format-2 keys; "rotation" "klt"; k_levels / k_cs are kept but unused by the rows):
 *   "k_klt_enc", "k_klt_dec"  f32 [L, H, D, D]     (likewise v_...)
 *   "k_klt_sigma"             f32 [L, H, D]        > 0: the coordinate's standard deviation
 *   "k_klt_width"             u8  [L, H, D]        0..6, each head's sum = k_bits[l] * D
 *   "k_klt_levels"            f32 [L, H, D, 64]    first 2^width ascending (units of sigma) */
#define QF_KV_RQ_FORMAT_KLT 3
typedef struct qf_kv_rq_klt_fit {
    float *enc[2], *dec[2], *sigma[2]; /* [L][H][D][D], [L][H][D][D], [L][H][D] */
    float *levels[2];                  /* [L][H][D][QF_KV_RQ_N_WIDTHS][64]: coordinate width w + 1 */
    uint8_t *width[2];                 /* [49][L][H][D]: the widths at e/8 code bits per element (e = 4..48) */
    double *rel8[2];                   /* [L][49] predicted relative error in the metric at e/8 bits (the
                                          water-filling's sum of measured per-coordinate distortions) */
    double *eig[2];                    /* [L][H][D] eigenvalues in the metric, descending */
    double *had_rel_mse[2];            /* [L][QF_KV_RQ_N_WIDTHS] the Hadamard codec's relative error in the same metric */
    bool eighths;                      /* allocate in 1/8-bit steps (qf_kv_rq_klt_allocate; set by the caller),
                                          else whole bits like formats 1 and 2 */
} qf_kv_rq_klt_fit;

/* Fit format 3 on top of qf_kv_rq_learn's fit f (its means and V predictor are reused; its
 * rel_mse is replaced by the format-3 codec's, measured in the metric): kw [L][H][D] per-channel
 * K error weights (or NULL: identity), vgram [L][H][D][D] per-head V Gram matrices (or NULL).
 * Of p it reads max_rows (rows per head fitted, 0: 4096), n_threads (the (layer, stream, head)
 * fits over that many threads; 0 or 1: the caller's only) and gpu (V minus its prediction and
 * the codecs' measured error on the device); the result is bit-identical for any count and
 * either device. QF_ERR_NOMEM,
 * QF_ERR_ARG (a non-finite weight), QF_ERR_DEVICE. */
QF_API qf_status qf_kv_rq_learn_klt(const qf_kv_capture_view *v, const float *kw, const float *vgram,
                                    const qf_kv_rq_learn_params *p, qf_kv_rq_fit *f, qf_error *err);
#define QF_KV_RQ_KLT_N_RATES 49 /* e = 0..48 eighths */
QF_API void qf_kv_rq_klt_fit_free(qf_kv_rq_klt_fit *k);
/* The fractional format-3 allocation (qf_kv_rq_allocate_min calls it when f->klt->eighths): like
 * the integer greedy but in steps of 1/8 bit per element (whole row bytes), from a floor of
 * min_bits (>= 1: 0.5-bit units generalized badly, docs/kv-rq.md), on the predicted errors rel8. bits[s][l] out as format-3 bit
 * values (32 + eighths, engine/kv_rq_klt.h); returns the predicted total damage. */
QF_API double qf_kv_rq_klt_allocate(const qf_kv_rq_fit *f, const double *const sens[2], double max_code_bits, int min_bits,
                                    int *const bits[2]);
/* Adds the format-3 arrays for the allocation bits[s][l] to pl (called by qf_kv_rq_payload). */
QF_API qf_status qf_kv_rq_klt_payload(const qf_kv_rq_fit *f, const int *const bits[2], qf_payload *pl, qf_error *err);

/* Fit from a capture (every layer and both streams must have at least 64 vectors). */
QF_API qf_status qf_kv_rq_learn(const qf_kv_capture_view *v, const qf_kv_rq_learn_params *p, qf_kv_rq_fit *out,
                         qf_error *err);
QF_API void qf_kv_rq_fit_free(qf_kv_rq_fit *f);
/* Ridge fit y ~ P x (P [dy][dx] out when not NULL, no intercept: a codec's mean absorbs it) and
 * the residual variance fraction of a centred ridge regression y[n][dy] ~ W x[n][dx]
 * when the inputs carry relative noise `noise` (e.g. 0.1 for 2-bit rows), measured on the
 * fitting rows with such noise added (NAN on failure). 1 = x predicts nothing of y. */
QF_API double qf_kv_rq_linear_fit(const float *x, const float *y, int64_t n, int dx, int dy, double noise, float *P);

/* The artifact payload for a bit allocation (bits[s][l] in 2..6 or 16) and sink/window. */
QF_API qf_status qf_kv_rq_payload(const qf_kv_rq_fit *f, const int *const bits[2], int n_sink, int n_window, qf_payload *pl,
                           qf_error *err);
/* pl, built by qf_kv_rq_payload from the same fit for any allocation, rewritten in place to
 * what qf_kv_rq_payload gives for bits, n_sink and n_window (the same entries, byte for byte):
 * only the allocation's arrays change, so a loop over allocations (the sensitivity and window
 * passes) does not copy the fit's matrices again each time. QF_ERR_ARG (pl untouched) when an
 * entry is missing or has another shape. */
QF_API qf_status qf_kv_rq_payload_update(const qf_kv_rq_fit *f, const int *const bits[2], int n_sink, int n_window,
                                         qf_payload *pl, qf_error *err);

/* Bits per element at context n_ctx, every overhead included (the engine's
 * qf_artifact_bits_per_element computes the same from a payload): mean over (stream, layer) of row bits / head_dim, plus
 * 16 * (n_sink + n_window) / n_ctx. */
QF_API double qf_kv_rq_bits_per_element(const int *const bits[2], int n_layer, int head_dim, int n_sink, int n_window,
                                 int n_ctx);

/* Greedy bit allocation. sens[s][l] is the measured damage (e.g. mean KLD) of (layer l,
 * stream s) alone at 2 bits; its damage at b bits is predicted as sens * rel_mse(b) /
 * rel_mse(2). Starting from 2 bits everywhere, repeatedly raise by one bit the unit with the
 * largest predicted gain, while the mean code bits stay <= max_code_bits. bits[s][l] out;
 * returns the predicted total damage. */
QF_API double qf_kv_rq_allocate(const qf_kv_rq_fit *f, const double *const sens[2], double max_code_bits, int *const bits[2]);
/* The same with a floor: every unit starts at min_bits (clamped to [QF_KV_RQ_MIN_BITS,
 * QF_KV_RQ_MAX_BITS]; 2-bit codebooks give the heaviest per-token tails) and the greedy raises
 * from there; when the floor alone exceeds max_code_bits every unit stays at the floor (the
 * caller checks the rate). qf_kv_rq_allocate is this with min_bits = QF_KV_RQ_MIN_BITS. */
QF_API double qf_kv_rq_allocate_min(const qf_kv_rq_fit *f, const double *const sens[2], double max_code_bits, int min_bits,
                                    int *const bits[2]);

#endif
