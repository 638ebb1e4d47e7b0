/* engine.h: engine-internal structures shared by model.c, kv_cache.c and forward.c.
 * The public view of these is include/qforge/model.h. */
#ifndef QF_ENGINE_H
#define QF_ENGINE_H

#include <stdatomic.h>

#include "qforge/kv.h"
#include "qforge/model.h"
#include "util/util.h"

struct qf_model {
    char path[4096];
    qf_gguf *gguf;
    qf_tokenizer *tok;
    qf_hparams hp;
    qf_weight tok_embd, output_norm, output;
    qf_weight rope_freqs; /* Llama-3.1 style per-dimension frequency factors; data NULL if absent */
    qf_layer_weights *layers;
    qf_weight *experts;  /* MoE: the per-expert views layers[].exp_* point into, or NULL */
    bool *bound;         /* while loading: which tensors of the file a weight was bound to */
    uint8_t sha256[32];
    bool sha_done;
    /* the CPU's private repacked copies of the Q4_0 weights (repack.c), made by the first CPU
     * context; NULL before (or when the CPU has no kernel for them). Written once under a lock. */
    _Atomic(struct qf_repack *) repack;
    bool repack_tried;
    bool prefaulted; /* qf_model_prefault ran (under repack.c's lock) */
};

/* ---- repacked Q4_0 weights (repack.c) ---- */
/* Once per model (later calls return at once): repack every Q4_0 matrix the forward pass
 * multiplies (kernels/gemm.h Q4X16) on pool's threads, then hand the GGUF pages of those
 * matrices back to the page cache. Only where qf_gemm_q4x16_supported; without memory for the
 * copy nothing changes (the GGUF rows keep serving). */
void qf_model_repack(qf_model *m, qf_pool *pool);
/* The repacked copy of w, or NULL (not repacked, or not a weight of m). */
const uint8_t *qf_model_repacked(const qf_model *m, const qf_weight *w);
/* Bytes of the repacked copies (0 when none). */
size_t qf_model_repacked_bytes(const qf_model *m);
/* Once per model, before its first CPU context runs: the mapped file faulted in (repack.c). */
void qf_model_prefault(qf_model *m);
/* Free the copies (qf_model_free). */
void qf_model_repack_free(qf_model *m);

/* ---- KV cache (kv_cache.c) ----
 * One row = the head_dim-long vector of one (layer, stream, position, kv head); rows of a
 * layer/stream are contiguous by position then kv head. */
typedef struct {
    qf_kv_mode mode_k, mode_v;
    int n_layer, n_ctx, n_head_kv, head_dim;
    size_t row_bytes[2];   /* [0] = K, [1] = V */
    uint8_t **data[2];     /* data[stream][layer] */
    /* QF_KV_INT8: static per-channel scales, [layer][kv head][head_dim] (per-head-slot scales
     * are stored expanded). NULL until an artifact binds them. */
    float *int8_scale[2], *int8_inv_scale[2];
    struct qf_kv_dict_bind *dict[2]; /* QF_KV_DICT: per-layer dictionaries, bound by an artifact */
    struct qf_kv_rq_bind *rq[2];     /* QF_KV_RQ: per-layer bit widths and codecs (kv_rq.h) */
    /* Exact sinks and recent window, any mode (qf_kv_cache_set_exact): positions < n_sink keep
     * an f16 copy (sink[s][layer]: [n_sink][n_head_kv][head_dim]); the last n_window positions
     * written by qf_kv_cache_push_window keep one in a ring (win[s][layer]: [n_window][n_head_kv]
     * [head_dim], slot p % n_window, win_pos[layer][slot] = the position it holds or -1). */
    int n_sink, n_window;
    uint16_t **sink[2], **win[2];
    int32_t **win_pos;
    /* K rows are stored before RoPE (any mode); the reader (forward.c) rotates each position
     * after qf_kv_cache_read_head. Writers must hand pre-RoPE K to qf_kv_cache_write. */
    bool k_prerope;
    /* --kv-rot (plain modes only): every row is rotated by qf_hadamard before it is stored and
     * rotated back after it is read; rot_buf is the write-side scratch [head_dim] (cache writes
     * run on one thread; reads rotate in the caller's buffer, so they may run in parallel) */
    qf_kv_rot rot;
    float *rot_buf;
    /* Sliding-window layers (qf_kv_cache_set_swa): ring_rows[layer] > 0 means that layer keeps
     * only its last ring_rows positions, position p in slot p % ring_rows, ring_pos[layer][slot]
     * = the position a slot holds (-1: none); 0 or NULL: all n_ctx positions */
    int *ring_rows;
    int32_t **ring_pos;
    /* QF_KV_INT8 row layout per stream (qf_kv_int8_layout); int8_buf [head_dim] is the write
     * scratch of the rotated layouts */
    uint8_t int8_layout[2];
    float *int8_buf;
    /* qf_kv_cache_write_pool: the threads' kv-rq encoder scratch (rq_par_n floats) */
    float *rq_par;
    size_t rq_par_n;
    /* both streams kv-rq: the coefficient-domain tables (qf_kv_rq_lin_build), or NULL */
    struct qf_kv_rq_lin *rq_lin;
} qf_kv_cache;

/* bytes allocated past the last row of a layer's storage (readers may load a few bytes past a row) */
#define QF_KV_ROW_PAD 8

/* QF_KV_RQ storage of one stream: layer l's rows are qf_kv_rq_row_bytes(head_dim, bits[l])
 * bytes (format/kv_rq_row.h); writes encode, reads decode. */
struct qf_kv_rq_bind {
    int *bits;          /* [n_layer]: 2..6 or QF_KV_RQ_BITS_F16 */
    size_t *row_bytes;  /* [n_layer] */
    float *levels;      /* [n_layer][n_head_kv][QF_KV_RQ_MAX_LEVELS] (first 2^bits used) */
    float *mean, *cs, *inv_cs; /* [n_layer][n_head_kv][head_dim] */
    float *scratch;     /* encoder scratch (cache writes run on one thread) */
    /* V stream only, or NULL: pred[l] [H*D][H*D] predicts a token's V (all kv heads) from its
     * decoded K rows (the K stream is rq, stored before RoPE); the V rows code the residual.
     * pred_on[l]: layer l has a nonzero predictor. */
    const float *pred;
    bool *pred_on;
    float *pred_buf;    /* writer scratch [2][H*D] */
    /* format 3 (kv_rq_klt.h), or NULL: per (layer, head) enc/dec [D][D], sigma [D], width [D],
     * levels [D][QF_KV_RQ_MAX_LEVELS]; replaces levels/cs in every non-f16 layer */
    const float *klt_enc, *klt_dec, *klt_levels;
    float *klt_sigma;
    float *klt_decT; /* dec transposed per (layer, head): the decoder's contiguous columns */
    uint8_t *klt_width;
    /* the cache's own copies of pred, klt_enc, klt_dec and klt_levels (freed with it), or NULL
     * where it reads the spec's arrays in place (qf_kv_stream_spec.rq_in_place) */
    float *own_pred, *own_enc, *own_dec, *own_levels;
};
/* How an int8 stream stores a row (kv-int8 payload "k_layout"/"v_layout"):
 *   STATIC      x / scale[channel] (the static per-channel scales), the original kv-int8
 *   STATIC_ROT  the same on the Walsh-Hadamard rotated row (scales fitted on rotated vectors)
 *   TOKEN_ROT   rotated row, its own scale per row carried in the codes' parities
 *               (qf_kv_int8_token_quantize): exactly 8 bits, no static scale used
 *   TOKEN       the same without the rotation
 *   EC_ROT      rotated rows, entropy-coded in exactly 8 bits per element (qf_kv_int8_ec_quantize):
 *               the step follows the RMS, not the maximum; the kv heads of one token are coded
 *               in groups of up to 256 elements (kv_cache.c ec_group); no static scale used */
typedef enum {
    QF_KV_INT8_STATIC = 0,
    QF_KV_INT8_STATIC_ROT,
    QF_KV_INT8_TOKEN_ROT,
    QF_KV_INT8_TOKEN,
    QF_KV_INT8_EC_ROT,
    QF_KV_INT8_LAYOUT_COUNT
} qf_kv_int8_layout;

/* QF_KV_DICT storage of one stream: a row is one packed code (qf_kv_code_pack layout:
 * sparsity atom indices + coefficients); writes OMP-encode, reads decode. */
/* QF_KV_DICT storage of one stream: a row is one packed code (qf_kv_code_fmt layout:
 * sparsity atom-index slots + coefficients); writes OMP-encode, reads decode. */
/* Dict caches keep the double Gram table up to this many atoms: 512 KiB a layer and stream, twice
 * the float Gram they hold anyway; larger dictionaries compute the dots per row. */
#define QF_KV_CACHE_GRAM_D_ATOMS 256
struct qf_kv_dict_bind {
    int n_atoms, sparsity;
    qf_kv_coef coef;
    qf_kv_code_fmt fmt;    /* the row layout (fmt.packed: bit-packed indices, payload v2) */
    float *tol;            /* [n_layer] error bound per layer (qf_kv_omp_ex tol), or NULL */
    qf_kv_dict *layer;     /* [n_layer]: unit-norm atoms and their Gram matrix */
    double **gram_d;       /* [n_layer] qf_kv_gram_d tables (the encoder's Cholesky dots, the same
                            * codes), or NULL above QF_KV_CACHE_GRAM_D_ATOMS atoms */
    float *scratch;        /* encoder scratch (cache writes run on one thread) */
    uint16_t *idx;         /* [sparsity] */
    float *coef_buf;       /* [sparsity] */
};

/* How one stream of a cache stores its rows. Plain modes (f32, f16, q8_0, q4_0) need only
 * `mode`; INT8 needs the static scales, DICT the dictionaries (both copied). */
typedef struct {
    qf_kv_mode mode;
    const float *int8_scale;   /* INT8: [n_layer][n_head_kv][head_dim], every entry > 0 */
    int int8_layout;           /* INT8: a qf_kv_int8_layout (0 = STATIC) */
    int n_atoms, sparsity;     /* DICT */
    qf_kv_coef coef;           /* DICT */
    const float *const *atoms; /* DICT: atoms[layer] = [n_atoms][head_dim], unit norm */
    const int *rq_bits;        /* RQ: [n_layer], each 2..6 or QF_KV_RQ_BITS_F16 */
    const float *rq_levels;    /* RQ: [n_layer][n_head_kv][QF_KV_RQ_MAX_LEVELS], first 2^bits ascending */
    const float *rq_mean, *rq_cs; /* RQ: [n_layer][n_head_kv][head_dim]; cs finite and nonzero */
    bool packed;               /* DICT: bit-packed indices (v2 layout) */
    const float *tol;          /* DICT: [n_layer] per-layer error bound, or NULL (fixed sparsity) */
    bool prerope;              /* K stream only: rows are stored before RoPE (qf_kv_cache.k_prerope) */
    const float *rq_pred;      /* RQ, V stream only, or NULL: [n_layer][H*D][H*D] V-from-K predictor
                                  (needs an rq K stream stored before RoPE; struct qf_kv_rq_bind) */
    /* RQ format 3 (engine/kv_rq_klt.h), all or none: enc, dec [n_layer][H][D][D], sigma [n_layer]
     * [H][D], width [n_layer][H][D] (each head's widths sum to bits * D), levels [n_layer][H][D]
     * [QF_KV_RQ_MAX_LEVELS] */
    const float *rq_klt_enc, *rq_klt_dec, *rq_klt_sigma, *rq_klt_levels;
    const uint8_t *rq_klt_width;
    /* RQ: read rq_pred, rq_klt_enc, rq_klt_dec and rq_klt_levels in place instead of copying them (they are
     * still checked): the caller keeps them alive and unchanged until the cache is freed */
    bool rq_in_place;
} qf_kv_stream_spec;

/* Plain modes only: INT8 and DICT are refused here (they run a certified artifact; see
 * qf_kv_cache_init_spec and src/engine/artifact_bind.c). */
qf_status qf_kv_cache_init(qf_kv_cache *kv, const qf_hparams *hp, int n_ctx, qf_kv_mode mk,
                           qf_kv_mode mv, qf_error *err);
/* Any modes, with the data an artifact binds. On failure *kv is left freed (zeroed). */
qf_status qf_kv_cache_init_spec(qf_kv_cache *kv, const qf_hparams *hp, int n_ctx,
                                const qf_kv_stream_spec spec[2], qf_error *err);
void qf_kv_cache_free(qf_kv_cache *kv);
/* Set the cache's row rotation (--kv-rot). NONE always succeeds. HADAMARD needs plain modes
 * on both streams (f32, f16, q8_0, q4_0: QF_ERR_ARG for int8/dict, whose artifacts define their
 * own storage) and a power-of-two head_dim (QF_ERR_UNSUPPORTED otherwise). Cache contents are
 * not converted: call it on a fresh cache. On failure the cache is unchanged. */
qf_status qf_kv_cache_set_rot(qf_kv_cache *kv, qf_kv_rot rot, qf_error *err);
/* Write n_rows consecutive rows starting at (pos, kv head 0): src is [n_rows][head_dim]. */
void qf_kv_cache_write(qf_kv_cache *kv, int stream, int layer, int pos, int n_pos,
                       const float *src);
/* qf_kv_cache_write with a kv-rq stream's encoding spread over pool's threads: the same bytes
 * (each position is encoded on its own). Other modes, sliding-window rings, small batches or
 * a NULL pool take qf_kv_cache_write. Not reentrant for one cache (shared scratch). */
void qf_kv_cache_write_pool(qf_kv_cache *kv, int stream, int layer, int pos, int n_pos, const float *src, qf_pool *pool);
/* The exact f16 sink copies of rows [pos, pos+n_pos) that are sinks (p < n_sink): src as for
 * qf_kv_cache_write. qf_kv_cache_write does this itself except for the K stream of a
 * k_prerope cache, whose sink copies must be the post-RoPE keys attention reads: forward.c
 * calls it with them. */
void qf_kv_cache_write_sinks(qf_kv_cache *kv, int stream, int layer, int pos, int n_pos, const float *src);
/* Read kv head `h` for positions [0, n_pos) into dst [n_pos][head_dim] f32. A sliding-window
 * layer's ring gives its last ring_rows positions; dst rows before them are zeroed. */
void qf_kv_cache_read_head(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos,
                           float *dst);
/* qf_kv_cache_read_head, except that rows stored rotated (qf_kv_cache_stream_rotated) stay in
 * the rotated basis (H x, no qf_hadamard on read): the attention then rotates its queries and
 * its output instead, two rotations a query rather than one a cached row and step (forward.c).
 * Other rows: the same. */
void qf_kv_cache_read_head_rotated(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos, float *dst);
/* The block type of a plain mode's rows (F32, F16, Q8_0, Q4_0), or QF_TYPE_COUNT for the others */
qf_type qf_kv_mode_row_type(qf_kv_mode m);
/* Kv heads stored together in one row (kv-int8 ec-rot: the group its entropy code spans), or 1. */
int qf_kv_cache_head_group(const qf_kv_cache *kv, int stream);
/* Read kv heads [h, h + qf_kv_cache_head_group) for positions [0, n_pos), head h + j into dst + j
 * hstride, as qf_kv_cache_read_head (rotated: as qf_kv_cache_read_head_rotated) reads each, the
 * same floats; a group's rows are decoded once for all its heads (h a multiple of the group). */
void qf_kv_cache_read_heads(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos, float *dst, size_t hstride,
                            bool rotated);
/* Whether stream `stream` of `layer` is kv-int8 ec-rot rows in plain slots (no sliding-window
 * ring): what qf_kv_cache_read_heads_span and qf_kv_cache_int8_scores read. */
bool qf_kv_cache_int8_ec_plain(const qf_kv_cache *kv, int stream, int layer);
/* qf_kv_cache_read_heads for positions [p0, p1) only: head h + j's row at position p into
 * dst + j hstride + p hd, the same floats (so spans that cover [0, n_pos) give that call's
 * output). Only where qf_kv_cache_int8_ec_plain. */
void qf_kv_cache_read_heads_span(const qf_kv_cache *kv, int stream, int layer, int h, int p0, int p1, float *dst,
                                 size_t hstride, bool rotated);
/* A one-query step's key scores straight from a kv-int8 ec-rot K stream (qf_kv_cache_int8_ec_plain),
 * the rows never stored: for kv heads h + k of h's group (k < qf_kv_cache_head_group, h a
 * multiple of it), query heads i < gq (1 <= gq <= QF_KV_EC_DOT_MAXQ) and positions p in [p0, p1),
 * y[((h + k) gq + i) ystride + p] = qf_vec_rows_dot's product of the row as
 * qf_kv_cache_read_heads(rotated = true) reads it with the query q + ((h + k) gq + i) head_dim:
 * the same bits (qf_kv_int8_ec_dot16 32 or 16 rows at a time, the rest decoded and dotted). */
void qf_kv_cache_int8_scores(const qf_kv_cache *kv, int layer, int h, int p0, int p1, const float *q, int gq, float *y,
                             size_t ystride);
/* kv-int8 ec-rot V rows of the group of kv heads from h, positions [p0, p1), weighted and summed
 * as they are decoded (a one-query step's values, forward.c att_job.i8vfused): for head h + k of
 * the group and its query heads i < gq (1 <= gq <= QF_KV_EC_DOT_MAXQ),
 * y[((h + k) gq + i) ystride + e] += sum over p of w[((h + k) gq + i) wstride + p] * row_p[k hd + e],
 * in a fixed order that depends only on p0, p1 and the rows (qf_kv_int8_ec_wsum16's lane sums, 32
 * or 16 rows at a time, folded in at the end; the last rows one at a time). acc: 64-byte aligned
 * scratch of g gq head_dim 16 floats, zero on entry and on return. */
void qf_kv_cache_int8_vsum(const qf_kv_cache *kv, int layer, int h, int p0, int p1, const float *w, int gq, size_t wstride,
                           float *acc, float *y, size_t ystride);
/* A dict stream's dictionary of `layer` (its sparsity cap into *sparsity when not NULL), or NULL
 * for a stream of another mode. */
const qf_kv_dict *qf_kv_cache_dict(const qf_kv_cache *kv, int stream, int layer, int *sparsity);
/* A dict stream's codes of kv head h, positions [0, n_pos), parsed (qf_kv_fmt_slots) into a
 * slot-major table: slot j of position p at idx[j * ld + p], coef[j * ld + p] (ld >= n_pos); an
 * unused slot or a corrupt index reads as index 0, coefficient 0. The stored row of p is then
 * sum_j coef * atom[idx], what qf_kv_cache_read_head returns. Not for a sliding-window ring layer
 * (asserted). */
void qf_kv_cache_dict_slots(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos, int32_t *idx, float *coef,
                            size_t ld);
/* Are the stream's rows stored rotated by qf_hadamard: --kv-rot, or a kv-int8 *_ROT layout? */
bool qf_kv_cache_stream_rotated(const qf_kv_cache *kv, int stream);
/* Does layer's V stream add a prediction from the token's stored K (a kv-rq V predictor)? */
bool qf_kv_cache_v_predicted(const qf_kv_cache *kv, int layer);
/* qf_kv_cache_read_head of the V stream, the same floats, with the predictor's K rows taken from
 * kdec: head g's positions [0, n_pos) at kdec + g * kstride, as qf_kv_cache_read_head(kv, 0, ...)
 * returns them (decoded, before any RoPE). The row route reads each K row once per layer this
 * way instead of once per V head. */
void qf_kv_cache_read_head_vpred(const qf_kv_cache *kv, int layer, int h, int n_pos, const float *kdec, size_t kstride,
                                 float *dst);
/* Keep only a window in the cache for hp's sliding-window layers: each such layer stores its
 * last min(n_ctx, n_swa - 1 + n_batch) positions in a ring (a batch of up to n_batch tokens
 * still finds every key its queries see). Call on a fresh cache, after init; no-op for models
 * without sliding-window layers or when the ring would not be smaller. QF_ERR_NOMEM. */
qf_status qf_kv_cache_set_swa(qf_kv_cache *kv, const qf_hparams *hp, int n_batch, qf_error *err);
/* True when every ring layer still holds positions [lo, hi) (always true without rings): a
 * decode that rewinds further back than its rings reach must start again at 0. On false,
 * *layer and *pos name the first missing one. */
bool qf_kv_cache_ring_holds(const qf_kv_cache *kv, int lo, int hi, int *layer, int *pos);
/* Bytes per token of the whole cache (K + V, every layer) at its n_ctx: the rows of every
 * position plus the exact sink and window copies spread over n_ctx positions. */
double qf_kv_cache_bytes_per_token(const qf_kv_cache *kv);

/* ---- exact sinks and recent window (generic: any storage mode) ----
 * For a query at position t, positions p < n_sink and t - n_window < p <= t are read exactly
 * (f16) and every other position reads the stored (compressed) row; forward.c applies it per
 * (t, p). Set after init (0, 0 switches it off); QF_ERR_ARG for negative sizes or more than
 * n_ctx, QF_ERR_NOMEM. */
qf_status qf_kv_cache_set_exact(qf_kv_cache *kv, int n_sink, int n_window, qf_error *err);
/* After a batch at [pos0, pos0+n) has run its attention for `layer`: keep the f16 copy of its
 * last min(n, n_window) positions (k, v: [n][n_head_kv][head_dim]) in the window ring. */
void qf_kv_cache_push_window(qf_kv_cache *kv, int layer, int pos0, int n, const float *k, const float *v);
/* The exact copy of (stream, layer, kv head h, position p) into dst[head_dim]: true when the
 * sink store or the window ring holds p, false otherwise (dst untouched). */
bool qf_kv_cache_exact_row(const qf_kv_cache *kv, int stream, int layer, int h, int p, float *dst);

/* ---- kv-rq in the coefficient domain (kv_rq_lin.c; forward.c's fast route) ----
 * Every kv-rq row is linear in its coefficients y[m] (kv_rq.h, kv_rq_klt.h):
 *   x = mean + T y     formats 1/2: T = diag(cs) H, y_k = s levels[code_k], m = head_dim;
 *                      format 3:    T = dec's first m columns, y_k = s sigma_k levels_k[code_k] for
 *                                   the k < m with a nonzero width, 0 for the others (m: one past
 *                                   the last coordinate with a nonzero width);
 *                      f16 layers:  T = I, mean = 0, y = x, m = head_dim.
 * A predicted V row (the V stream's pred_on[l]) adds P_h k^ over the token's decoded K rows,
 * itself linear in K's coefficients yk (the K heads' y side by side, kdim = sum of their m):
 *   v = mean_v + T_v y_v + P_h (mean_K + T_K yk).
 * So sum_p w_p v_p = W mean_v + T_v (sum_p w_p y_v,p) + P_h (W mean_K + T_K (sum_p w_p yk_p)), W =
 * sum_p w_p: attention over the coefficients needs one transform per query, not one decode per
 * position. The same sums in another order as the row decoder (kv_rq.h): equal to rounding.
 * The tables hold no matrix of their own where the coded coordinates are a prefix (T_K, T_v are
 * the cache's decT rows, P the payload's): nothing per model beyond the bind's. */
typedef struct qf_kv_rq_lin qf_kv_rq_lin;
/* Build kv->rq_lin when both streams are kv-rq (no-op otherwise or when built); QF_ERR_NOMEM. */
qf_status qf_kv_rq_lin_build(qf_kv_cache *kv, qf_error *err);
void qf_kv_rq_lin_free(qf_kv_cache *kv);
/* m of (stream, layer, kv head); kdim and K head g's column offset in the K coefficient row of
 * a layer; whether V is predicted there. kv->rq_lin must be built. */
int qf_kv_rq_lin_dim(const qf_kv_cache *kv, int stream, int layer, int h);
int qf_kv_rq_lin_kdim(const qf_kv_cache *kv, int layer);
int qf_kv_rq_lin_koff(const qf_kv_cache *kv, int layer, int g);
bool qf_kv_rq_lin_pred_on(const qf_kv_cache *kv, int layer);
/* The coefficients of positions [p0, p0 + n) of kv head h into dst (row p at dst + (p-p0) ld,
 * m floats). No sliding-window rings (kv-rq refuses them). */
void qf_kv_rq_lin_coef(const qf_kv_cache *kv, int stream, int layer, int h, int p0, int n, float *dst, size_t ld);
/* dst [n][head_dim] = mean + T y for n coefficient rows y (stride ld): the stored rows without
 * V's prediction (format 3: one GEMM). */
void qf_kv_rq_lin_decode(const qf_kv_cache *kv, int stream, int layer, int h, int n, const float *y, size_t ld,
                         float *dst);
/* dst [n][head_dim] += P_h k^ for n K coefficient rows (stride ld), V head h: k^ = mean_K + T_K
 * yk decoded one K head at a time into scratch (n head_dim floats); no-op on a layer without prediction. */
void qf_kv_rq_lin_pred(const qf_kv_cache *kv, int layer, int h, int n, const float *yk, size_t ld, float *dst,
                       float *scratch);
/* out[head_dim] = wsum mean + T ysum: a weighted sum of rows from the weighted sum of their
 * coefficients (ysum[m]) and of the weights (wsum). */
void qf_kv_rq_lin_apply(const qf_kv_cache *kv, int stream, int layer, int h, const float *ysum, float wsum,
                        float *out);
/* out[head_dim] += P_h (wsum mean_K + T_K yksum): the predicted part of that sum (V head h), the K
 * rows' weighted sum made per K head by qf_kv_rq_lin_apply; scratch: (H + 1) head_dim floats.
 * No-op on a layer without prediction. */
void qf_kv_rq_lin_apply_pred(const qf_kv_cache *kv, int layer, int h, const float *yksum, float wsum, float *out,
                             float *scratch);
/* One stored row of (stream, layer, kv head h, position p) fully decoded (prediction included),
 * by the row decoder (kv_rq.h), into dst[head_dim]. */
void qf_kv_cache_read_pos(const qf_kv_cache *kv, int stream, int layer, int h, int p, float *dst);

/* MoE routing (mixtral, qwen3moe), the one definition the CPU forward and the CUDA backend
 * share: for each of n tokens, p = softmax(logits[t]) (written back into logits), the top
 * hp->n_expert_used experts by p (ties: the lower index) into ids[t][k], and their weights
 * w[t][k] = p (divided by their sum when hp->expert_norm_w). */
void qf_moe_route(const qf_hparams *hp, float *logits, int n, int *ids, float *w);

struct qf_cuda_ctx;

struct qf_context {
    qf_model *model;
    struct qf_cuda_ctx *gpu; /* non-NULL when the context runs on the GPU */
    qf_context_params params;
    qf_pool *pool;
    qf_kv_cache kv;
    const qf_tap *tap;
    int n_batch;
    /* scratch activations, sized for n_batch tokens */
    float *x, *xn, *q, *k, *v, *att, *hb, *hb2;
    /* per-thread scratch for matmul tiles and attention */
    float **thr_buf;
    size_t thr_buf_floats;
    void *xq;             /* quantized activations for the vec_dot path */
    size_t xq_bytes;
    float *rope_cos, *rope_sin; /* [n_batch][n_rot/2] for the current batch */
    /* artifact binding (artifact_bind.c): while bound, params.kv_k/kv_v name the artifact's
     * modes; base_kv_k/base_kv_v are the modes the context was created with */
    int bound;            /* 0 = nothing bound (calloc'd), else 1 + the qf_artifact_kind */
    qf_kv_mode base_kv_k, base_kv_v; /* recorded when binding */
    /* how the CPU reads a kv-rq cache (forward.c): QF_RQ_ROUTE_AUTO, or one route forced (tests,
     * benchmarks; the environment's QF_RQ_ROUTE=rows|explicit|coef at creation) */
    int rq_route;
    /* params.canonical and not params.reference: the canonical kernels (kernels/canon.h) on the
     * CPU; canon_scr: their scratch, at this float offset in each thr_buf */
    bool canon;
    size_t canon_scr;
};

/* qf_decode's argument checks (forward.c): a batch of 1..n_batch tokens, positions pos0 ..
 * pos0 + n - 1 inside the context, every token id in the vocabulary. QF_ERR_ARG naming what is
 * wrong, else QF_OK. Every decode entry calls it (qf_decode, the GPU's qf_gpu_decode_topk). */
qf_status qf_decode_check(const qf_context *c, const int32_t *tokens, int n, int pos0, qf_error *err);

enum {
    QF_RQ_ROUTE_AUTO = 0,
    QF_RQ_ROUTE_ROWS,     /* the row decoder per position (qf_kv_cache_read_head), as the reference route */
    QF_RQ_ROUTE_EXPLICIT, /* coefficient runs decoded by GEMMs, V's prediction added per position */
    QF_RQ_ROUTE_COEF      /* V attention in the coefficient domain (engine.h, kv-rq) */
};

#endif
