/* qforge/awq.h: weight re-quantization to GGUF (round-to-nearest, as llama-quantize) and
 * activation-aware weight quantization (AWQ) for 4-bit weights, written as a Q4_0 GGUF that
 * llama.cpp runs unchanged (the scales are folded into the model, no new operator).
 *
 * AWQ, per layer and per group of linears sharing one input:
 *   attn_norm -> attn_q, attn_k, attn_v     (scales fold into the attn_norm gain)
 *   ffn_norm  -> ffn_gate, ffn_up           (scales fold into the ffn_norm gain)
 *   ffn_up    -> ffn_down                   (the input is silu(gate)*up: scales fold into
 *                                            ffn_up's rows)
 *   attn_v    -> attn_output                (under GQA one scale per kv-head channel,
 *                                            applied to every query head of its group)
 * per input channel s = mean|x|^alpha (normalized by sqrt(max*min)), alpha chosen on a grid by
 * the MSE of the group's output on real calibration rows with the Q4_0 round trip in the loop:
 * || X W^T - (X/s) Q(W*s)^T ||^2. Then W*s is quantized (with a per-block scale search, see
 * qf_awq_params.clip) and the gains / rows divided by s. docs/awq.md has the numbers.
 *
 * ---- Flow with the pipeline (qforge calibrate --artifact awq) ----
 *   1. qf_awq_run(ref_model, calib_tokens, ..., "OUT.gguf", &rep)    writes the AWQ-Q4_0 model
 *      (atomically). rep.sha256 is the file's SHA-256, rep.tensor_sha256 the SHA-256 of its
 *      tensor data section (unchanged by step 3).
 *   2. certify: load OUT.gguf, measure ref (the input model) vs candidate on the evaluation
 *      split (PPL, KLD, top-1), same code path.
 *   3. qf_awq_embed_certificate("OUT.gguf", &cert, &rep, &sha)        rewrites OUT.gguf
 *      atomically with `qforge.*` metadata keys added (certificate numbers, provenance, the
 *      per-layer alphas); tensor bytes are copied unchanged, so what was measured is what
 *      ships. `sha` is the final file's SHA-256: it is what the .qfa payload names
 *      ("gguf_sha256"), not rep.sha256.
 *   4. package the .qfa beside OUT.gguf.
 * A failed gate: the pipeline removes OUT.gguf (no artifact).
 *
 * Keys written by qf_awq_embed_certificate (all under "qforge."; an existing qforge.* key is
 * replaced): qforge.kind="awq", qforge.engine_version, qforge.engine_commit,
 * qforge.created_utc, qforge.model_sha256 (hex of the reference GGUF), qforge.model_name,
 * qforge.corpus_sha256 (hex), qforge.split, qforge.calib_tokens, qforge.eval_tokens (u32,
 * saturated), qforge.ref_ppl, qforge.cand_ppl, qforge.delta_ppl, qforge.kld_mean,
 * qforge.kld_p99, qforge.top1_agreement, qforge.gate_max_delta_ppl (f32), qforge.passed
 * (bool), qforge.awq.alpha (string: per layer "qkv,gate_up,down,vo" values, ';'-separated;
 * -1 = group not scaled), qforge.awq.grid, qforge.awq.rows (u32), qforge.awq.type ("q4_0"),
 * qforge.awq.tensor_sha256 (hex). */
#ifndef QFORGE_AWQ_H
#define QFORGE_AWQ_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "qforge/artifact.h"
#include "qforge/error.h"
#include "qforge/model.h"
#include "qforge/quant.h"

/* ---- round-to-nearest re-quantization (qforge quantize IN OUT TYPE) ----
 * type: QF_TYPE_F16, QF_TYPE_Q8_0 or QF_TYPE_Q4_0 (anything else: QF_ERR_ARG). Like
 * llama-quantize: 1-D tensors (norms, biases) stay F32; 2-D weights become `type`; for the
 * quantized types the output matrix (token_embd when the output is tied) becomes Q8_0 (llama.cpp
 * uses Q8_0 when its row is not a multiple of 256, else Q6_K, which we do not write: Q8_0 then;
 * compare with llama-quantize --output-tensor-type q8_0); a tensor whose row is not a multiple
 * of the block size stays F16. All metadata is copied; general.file_type is updated. Input
 * tensors may be F32, F16, BF16, Q8_0, Q4_0, ... (anything qf_dequantize_row reads).
 * The MoE router (ffn_gate_inp) stays as it is, as llama-quantize keeps it; 3-D expert tensors
 * are quantized row by row. Every family qforge loads (QF_ERR_UNSUPPORTED for any other
 * general.architecture). Output written atomically. */
QF_API qf_status qf_quantize_model(const char *in_path, const char *out_path, qf_type type, qf_error *err);

/* The type a tensor gets under qf_quantize_model (exposed for tests and docs);
 * QF_TYPE_COUNT: the tensor is copied unchanged (1-D tensors, norms, non-weights). */
QF_API qf_type qf_quantize_tensor_type(const char *name, uint32_t n_dims, const int64_t *ne, qf_type type,
                                bool output_tied);

/* ---- AWQ ---- */
typedef enum {
    QF_AWQ_QKV = 0,  /* attn_norm -> q, k, v */
    QF_AWQ_GATE_UP,  /* ffn_norm -> gate, up */
    QF_AWQ_DOWN,     /* up -> down */
    QF_AWQ_VO,       /* v -> o (no GQA only) */
    QF_AWQ_GROUP_COUNT
} qf_awq_group;

QF_API const char *qf_awq_group_name(qf_awq_group g); /* "qkv", "gate_up", "down", "vo" */

typedef struct {
    int n_grid;            /* alpha grid: k / n_grid for k = 0 .. n_grid-1 (default 20) */
    int rows_per_site;     /* calibration rows kept per layer and site (default 512) */
    int n_ctx;             /* capture window in tokens (0 = min(512, n_ctx_train)) */
    int64_t max_tokens;    /* calibration tokens used (<= 0: all given; default 8192), in
                              windows spread evenly over the whole calibration text */
    bool clip;             /* per-block Q4_0 scale search after folding (default true): for each
                              block of 32, RTN and 19 candidate scales refitted by weighted least
                              squares (ggml's make_qx_quants recipe), weights = E[x^2] of the
                              folded input; keeps the best (RTN included). Off: plain RTN. */
    bool scale_vo;         /* v -> o group when shapes allow (default true); under GQA one scale
                              per kv-head channel, shared by the query heads of its group */
    bool ffn_act_loss;     /* gate_up scored on the block output W_down (silu(gate) * up) with
                              the f32 W_down instead of the stacked gate/up outputs (default false:
                              measured no better, docs/awq.md) */
    bool block_cov;        /* block search with each block's full 32x32 input covariance
                              E[x_b x_b^T] (folded) and a greedy rounding descent on it, instead
                              of the diagonal importance (default true; needs clip) */
    bool duo;              /* s = mean|x|^a / mean|w~|^(1-a) (AutoAWQ's duo_scaling, w~ = |w| /
                              block max) instead of mean|x|^a (default false) */
    float fixed_alpha;     /* < 0: search (default -1); >= 0: this alpha for every group
                              (0 gives exactly RTN when clip is false) */
    bool keep_float;       /* testing: fold the scales but keep the input's weight types
                              (no quantization): the model must compute the same function */
    int n_threads;         /* 0 = all cores */
    bool progress;         /* progress bar on a TTY */
    uint64_t seed;         /* row reservoir seed */
    qf_device device;      /* where the capture, the alpha search and the block quantizer run:
                              QF_DEVICE_CPU (the default), QF_DEVICE_CUDA (QF_ERR_DEVICE when no
                              GPU answers) or QF_DEVICE_AUTO (the GPU when one answers and its
                              backend runs the model, else the CPU). On the
                              GPU the quantized blocks are the CPU's bit for bit for the same
                              inputs; the capture (f32 GEMMs) and the search's sums differ from
                              the CPU's in their last bits (docs/awq.md, "On the GPU") */
} qf_awq_params;

QF_API qf_awq_params qf_awq_default_params(void);

typedef struct {
    int n_layer;
    /* [n_layer][QF_AWQ_GROUP_COUNT]; alpha -1 when the group was not scaled (skipped) */
    float *alpha;
    float *clip;           /* mean |d| chosen / |d| of RTN per group (1 = RTN; q / gate / down / o) */
    double *mse_rtn;       /* group output MSE on the calibration rows, plain RTN */
    double *mse_awq;       /* ... with the chosen scales (and clip) */
    bool vo_skipped_gqa;   /* the v -> o group was skipped: n_head not a multiple of n_head_kv */
    int64_t calib_tokens;  /* tokens run through the model */
    int64_t rows_used;     /* rows kept per site (<= rows_per_site) */
    int n_grid;
    double seconds;        /* whole run */
    double seconds_capture, seconds_search, seconds_quant, seconds_write; /* its parts */
    bool on_gpu;           /* capture, search and block quantizer ran on the GPU */
    uint8_t sha256[32];    /* of the written file */
    uint8_t tensor_sha256[32]; /* of its tensor data section */
    char sha256_hex[65], tensor_sha256_hex[65];
} qf_awq_report;

QF_API void qf_awq_report_free(qf_awq_report *r);

/* Learn the scales on calib_tokens (one tokenized text, BOS handled like capture: windows of
 * n_ctx, BOS first when the vocabulary adds it) with the reference model `m` (its weights may
 * be F32/F16/BF16/Q8_0), fold them, quantize every 2-D weight to Q4_0 (output/token_embd as
 * qf_quantize_model does) and write out_gguf atomically. rep may be NULL; when given it is
 * filled (free with qf_awq_report_free). Errors: QF_ERR_ARG (bad params, too few tokens),
 * QF_ERR_UNSUPPORTED (architecture), QF_ERR_IO. */
QF_API qf_status qf_awq_run(qf_model *m, const int32_t *calib_tokens, int64_t n_calib,
                     const qf_awq_params *p, const char *out_gguf, qf_awq_report *rep,
                     qf_error *err);

/* Step 3 of the flow: rewrite gguf_path atomically with the qforge.* keys from cert (and the
 * alphas of rep when non-NULL), tensors unchanged. sha256_out (may be NULL) receives the new
 * file's SHA-256. */
QF_API qf_status qf_awq_embed_certificate(const char *gguf_path, const qf_certificate *cert,
                                   const qf_awq_report *rep, uint8_t sha256_out[32],
                                   qf_error *err);

#endif
