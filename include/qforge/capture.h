/* qforge/capture.h: the capture stage of the forge. Run OUR engine over calibration tokens
 * with taps on and keep
 *   - the real post-RoPE K and the V vectors of every layer and kv head, bounded at
 *     max_per_layer vectors per layer per stream (a deterministic reservoir over tokens, so
 *     the sample covers the whole corpus and memory stays bounded whatever its length);
 *   - per input channel of every linear group: sum|x|, sum x^2, max|x| and the token count.
 * The taps are per-context hook objects: a context without one pays one NULL check. */
#ifndef QFORGE_CAPTURE_H
#define QFORGE_CAPTURE_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "qforge/error.h"
#include "qforge/kvlearn.h"
#include "qforge/model.h"

typedef struct {
    int64_t max_per_layer; /* K (and V) vectors kept per layer; 0 = no KV capture */
    bool activations;      /* collect per-channel activation statistics */
    uint64_t seed;         /* reservoir sampling seed */
    bool k_prerope;        /* keep K before RoPE (CPU route only: the tap's on_k_prerope) */
} qf_capture_params;

/* Per-channel statistics of one linear group's input (see qf_act_site). */
typedef struct {
    int dim;
    int64_t count; /* tokens seen */
    double *sum_abs, *sum_sq;
    float *max_abs;
} qf_act_stats;

typedef struct qf_capture qf_capture;

QF_API qf_capture *qf_capture_new(const qf_hparams *hp, const qf_capture_params *p, qf_error *err);
QF_API void qf_capture_free(qf_capture *cap);
/* The tap to install with qf_context_set_tap while capturing. */
QF_API const qf_tap *qf_capture_tap(qf_capture *cap);
/* Drop everything captured so far (keeps the buffers). */
QF_API void qf_capture_clear(qf_capture *cap);

/* Run the context over tokens in windows of n_ctx (each from an empty cache, BOS first when
 * the vocabulary adds BOS, as the perplexity oracle does) with the capture's tap installed;
 * the tap is removed on every exit path. max_tokens <= 0: all tokens. */
QF_API qf_status qf_capture_run(qf_context *c, qf_capture *cap, const int32_t *tokens, int64_t n_tokens,
                         int n_ctx, int64_t max_tokens, bool progress, qf_error *err);

/* What was captured, as the learners take it (vectors in capture order: token-major,
 * kv-head-minor). Valid until the next run, clear or free. */
QF_API qf_kv_capture_view qf_capture_kv_view(const qf_capture *cap);
QF_API int64_t qf_capture_tokens_seen(const qf_capture *cap);
QF_API const qf_act_stats *qf_capture_act(const qf_capture *cap, int layer, qf_act_site site);

/* Largest relative difference between two captures of the same tokens (the scalar reference
 * route vs the fast route): max over layers/streams of ||a - b|| / ||a||. */
QF_API double qf_capture_max_rel_diff(const qf_capture *a, const qf_capture *b);

#endif
