/* qforge/model.h: a loaded model (llama, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, phi3 and the
 * llama-architecture MoE (mixtral)) and the inference context that runs it: batched prefill,
 * incremental decode, the KV cache and the capture taps. docs/families.md lists what each family
 * uses. */
#ifndef QFORGE_MODEL_H
#define QFORGE_MODEL_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/error.h"
#include "qforge/gguf.h"
#include "qforge/quant.h"
#include "qforge/tokenizer.h"

typedef enum {
    QF_ARCH_LLAMA = 0, /* also the mixtral-style MoE: llama with llama.expert_count > 0 */
    QF_ARCH_QWEN2 = 1,
    QF_ARCH_QWEN3,
    QF_ARCH_QWEN3MOE,
    QF_ARCH_GEMMA2,
    QF_ARCH_GEMMA3,
    QF_ARCH_PHI3,
    QF_ARCH_QWEN2MOE, /* qwen2 attention (q/k/v biases) + MoE with a sigmoid-gated shared expert */
    QF_ARCH_COUNT
} qf_arch;
/* the feed-forward gate's activation: silu(gate) * up (SwiGLU) or gelu_tanh(gate) * up (GeGLU) */
typedef enum { QF_FFN_SILU = 0, QF_FFN_GELU_TANH = 1 } qf_ffn_act;
/* which layers attend through a sliding window of n_swa positions (the rest attend globally) */
typedef enum {
    QF_SWA_NONE = 0,
    QF_SWA_ALL,     /* phi3: every layer */
    QF_SWA_EVEN,    /* gemma2: layers 0, 2, 4, ... */
    QF_SWA_PATTERN  /* gemma3: every layer except each swa_pattern-th (il % pattern == pattern - 1) */
} qf_swa_kind;
typedef enum { QF_ROPE_NORM = 0, QF_ROPE_NEOX = 2 } qf_rope_type; /* ggml's numbering */

typedef struct {
    qf_arch arch;
    char arch_name[32];
    char name[128]; /* general.name */
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    int n_rot;      /* rope dimension count (<= head_dim) */
    float rope_freq_base, rope_freq_scale, rms_eps;
    qf_rope_type rope_type;
    bool tied_output;
    /* ---- family features (docs/families.md); the llama/qwen2 values are the neutral ones ---- */
    float embd_scale;      /* token embeddings are multiplied by this (gemma: sqrt(n_embd); else 1) */
    float attn_scale;      /* q.k scale (1/sqrt(head_dim)) */
    float attn_softcap;    /* > 0: scores = c * tanh(scores / c) before the softmax (gemma2) */
    float final_softcap;   /* > 0: logits = c * tanh(logits / c) (gemma2) */
    qf_swa_kind swa;       /* sliding-window layers */
    int n_swa;             /* their window: a query at t sees keys t - n_swa < p <= t */
    int swa_pattern;       /* QF_SWA_PATTERN: period (gemma3: 6) */
    float rope_freq_base_swa; /* RoPE base of the sliding-window layers (gemma3: 10000); = rope_freq_base otherwise */
    bool qk_norm;          /* per-head RMS norm of q and k before RoPE (qwen3, gemma3) */
    bool post_norms;       /* RMS norm of the attention and FFN outputs before the residual add (gemma) */
    bool fused_qkv;        /* one attn_qkv tensor (phi3) */
    bool fused_gate_up;    /* one ffn_up tensor holding gate then up (phi3) */
    qf_ffn_act ffn_act;
    int n_expert, n_expert_used; /* MoE: experts per layer and the top-k each token uses (0 = dense) */
    int n_ff_exp;          /* MoE: hidden size of one expert */
    bool expert_norm_w;    /* MoE: the top-k softmax weights are renormalized to sum to 1 */
    int n_ff_shexp;        /* MoE with a shared expert (qwen2moe): its hidden size; 0 = none */
} qf_hparams;

/* general.architecture's name of a (llama.cpp's), NULL outside [0, QF_ARCH_COUNT): the one list of
 * the architectures qforge runs */
QF_API const char *qf_arch_name(qf_arch a);
/* true when layer il attends through the sliding window */
QF_API bool qf_hparams_layer_swa(const qf_hparams *hp, int il);
/* A one-line, comma-separated list of the family features hp uses ("qk-norm, gelu-tanh, ...";
 * "" for plain llama) into buf; returns buf. */
QF_API const char *qf_hparams_features(const qf_hparams *hp, char *buf, size_t size);

/* One tensor of the model as stored in the file (data points into the mapping). */
typedef struct {
    qf_type type;
    int64_t ne0, ne1; /* ne0 = input (contiguous) dim, ne1 = output rows */
    const void *data;
    size_t row_bytes;
} qf_weight;

typedef struct {
    /* wq/wk/wv are row views into attn_qkv and w_gate/w_up into the fused ffn_up when the family
     * fuses them (phi3): every consumer sees three (two) ordinary weights either way */
    qf_weight attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
    qf_weight bq, bk, bv; /* qwen2 only; data == NULL when absent */
    qf_weight q_norm, k_norm;               /* [head_dim] (qk_norm); data == NULL when absent */
    qf_weight post_attn_norm, post_ffw_norm; /* [n_embd] (post_norms) */
    /* MoE (n_expert > 0; the dense w_gate/w_up/w_down are then absent): the router
     * ffn_gate_inp [n_embd -> n_expert] and one 2-D view per expert into the 3-D tensors */
    qf_weight gate_inp;
    qf_weight *exp_gate, *exp_up, *exp_down; /* [n_expert] each, NULL for a dense layer */
    /* the shared expert (n_ff_shexp > 0; data == NULL otherwise): every token adds
     * sigmoid(x . gate_inp_shexp) * down_shexp(silu(gate_shexp x) * up_shexp x) */
    qf_weight gate_inp_shexp; /* [n_embd] -> 1 */
    qf_weight w_gate_shexp, w_up_shexp, w_down_shexp;
} qf_layer_weights;

typedef struct qf_model qf_model;

QF_API qf_model *qf_model_load(const char *path, qf_error *err);
QF_API void qf_model_free(qf_model *m);
QF_API const qf_hparams *qf_model_hparams(const qf_model *m);
QF_API const qf_tokenizer *qf_model_tokenizer(const qf_model *m);
QF_API const qf_gguf *qf_model_gguf(const qf_model *m);
/* SHA-256 of the whole GGUF file (computed once, on first call). */
QF_API const uint8_t *qf_model_sha256(qf_model *m);
QF_API const qf_layer_weights *qf_model_layer(const qf_model *m, int il);
QF_API const qf_weight *qf_model_tok_embd(const qf_model *m);
QF_API const qf_weight *qf_model_output_norm(const qf_model *m);
QF_API const qf_weight *qf_model_output(const qf_model *m); /* tok_embd when tied */

/* ---- KV cache storage ---- */
typedef enum {
    QF_KV_F32 = 0,
    QF_KV_F16,
    QF_KV_Q8_0,  /* llama.cpp -ctk/-ctv q8_0 equivalent */
    QF_KV_Q4_0,  /* llama.cpp -ctk/-ctv q4_0 equivalent */
    QF_KV_INT8,  /* int8 with static calibrated scales (forge artifact) */
    QF_KV_DICT,  /* sparse dictionary codes (forge artifact) */
    QF_KV_RQ,    /* calibrated rotated low-bit codes (kv-rq artifact, CPU only) */
    QF_KV_MODE_COUNT
} qf_kv_mode;

/* Rotation applied to every K and V row (per kv head, head_dim long) before it is stored and
 * undone after it is read, so attention sees the same vectors up to quantization error.
 * HADAMARD is llama.cpp's default for quantized caches (head_dim must be a power of two). */
typedef enum {
    QF_KV_ROT_NONE = 0,
    QF_KV_ROT_HADAMARD = 1
} qf_kv_rot;

/* "none", "hadamard" (case-insensitive on parse; false for anything else) */
QF_API const char *qf_kv_rot_name(qf_kv_rot r);
QF_API bool qf_kv_rot_from_name(const char *name, qf_kv_rot *out);
QF_API const char *qf_kv_mode_name(qf_kv_mode m);
QF_API bool qf_kv_mode_from_name(const char *name, qf_kv_mode *out);

/* ---- capture taps ----
 * Per-context hook object: a context with tap == NULL pays one NULL check per site.
 * on_kv receives, for one layer and a batch of n_tok tokens, the post-RoPE K and the V
 * vectors exactly as written to the cache: k and v are [n_tok][n_head_kv][head_dim] f32.
 * on_act receives the input of a group of linears: x is [n_tok][dim] f32. */
typedef enum {
    QF_ACT_ATTN_IN = 0, /* attn_norm output -> q, k, v */
    QF_ACT_ATTN_OUT,    /* attention output -> attn_output (wo) */
    QF_ACT_FFN_IN,      /* ffn_norm output -> gate, up */
    QF_ACT_FFN_DOWN,    /* silu(gate)*up -> ffn_down */
    QF_ACT_SITE_COUNT
} qf_act_site;

typedef struct qf_tap {
    void *user;
    void (*on_kv)(void *user, int layer, int pos0, int n_tok, int n_head_kv, int head_dim,
                  const float *k, const float *v);
    void (*on_act)(void *user, int layer, qf_act_site site, int n_tok, int dim, const float *x);
    /* Optional (CPU route): K of a batch after the bias and BEFORE RoPE, [n_tok][n_head_kv]
     * [head_dim], called before on_kv of the same layer and batch (pre-RoPE key learners). */
    void (*on_k_prerope)(void *user, int layer, int pos0, int n_tok, int n_head_kv, int head_dim,
                         const float *k);
    /* Optional (CPU route): the queries of a batch after the bias and RoPE, [n_tok][n_head]
     * [head_dim], called before on_kv of the same layer and batch (query-aware KV learners). */
    void (*on_q)(void *user, int layer, int pos0, int n_tok, int n_head, int head_dim, const float *q);
} qf_tap;

/* ---- context ---- */
typedef enum {
    QF_DEVICE_AUTO = 0, /* CUDA when a GPU is found, else CPU */
    QF_DEVICE_CPU,
    QF_DEVICE_CUDA
} qf_device;

QF_API const char *qf_device_name(qf_device d);
QF_API bool qf_device_from_name(const char *name, qf_device *out);
/* True when this build has the CUDA backend and a GPU answers. */
QF_API bool qf_cuda_available(void);

/* CUDA backend knobs; all false = the default (certified) routes. The library never reads the
 * environment: the CLI and the benches set these from QF_CUDA_GEMM=f32, QF_CUDA_ATTN=warp,
 * QF_CUDA_GU16=1, QF_CUDA_F16_CACHE=0, QF_CUDA_PROFILE=1, QF_CUDA_GRAPH=0, QF_CUDA_PDL=0,
 * QF_CUDA_Q4G=0, QF_CUDA_I8_EXPAND=1 and QF_CUDA_NORM_FOLD=0. */
typedef struct {
    bool gemm_f32;     /* dequantize to f32 and use sgemm for every matmul */
    bool attn_warp;    /* the one-warp-per-(query, head) attention kernel for prefill too */
    bool gu16;         /* experimental, not certified: the gate|up GEMM writes f16 */
    bool no_f16_cache; /* no persistent f16 copy of quantized weights for prefill GEMMs */
    bool profile;      /* GPU time per stage printed to stderr when the context is freed */
    bool no_graph;     /* one-token decode steps launch kernel by kernel instead of replaying a CUDA graph */
    bool no_pdl;       /* the decode graph without programmatic dependent launch (QF_CUDA_PDL=0) */
    bool no_q4_regroup; /* q4_0 and Q6_K weights stay in the GGUF block layouts on the device (QF_CUDA_Q4G=0) */
    bool i8_expand;     /* int8 decode expands the layer's cache to f16 rows every step instead of reading it in
                           place (QF_CUDA_I8_EXPAND=1; the route before session 34, for comparisons) */
    bool no_norm_fold;  /* one-token decode runs each RMSNorm as a kernel of its own instead of folding it into
                           the q4_0 / q8_0 matvecs around it (QF_CUDA_NORM_FOLD=0; the route before session 43) */
} qf_cuda_params;

typedef struct {
    int n_ctx;       /* max positions in the KV cache (0 = model's n_ctx_train) */
    int n_batch;     /* max tokens per qf_decode call for scratch sizing (0 = n_ctx) */
    int n_threads;   /* 0 = all cores */
    qf_kv_mode kv_k, kv_v;
    qf_kv_rot kv_rot; /* NONE (default) or HADAMARD (--kv-rot): each K and V row is Walsh-Hadamard
                         rotated before it is stored and rotated back on read; plain modes only
                         (binding an artifact to such a context is refused), head_dim a power of
                         two. On the GPU route only when the backend supports it: under --device
                         auto the context falls back to the CPU, under --device cuda it is refused */
    bool reference;  /* scalar oracle kernels and no BLAS: the CPU reference path */
    bool canonical;  /* the canonical arithmetic (docs/gpu.md "Canonical arithmetic"): every number
                        is the same bits on the CPU (any thread count or instruction set) and on
                        the GPU, where qf_context_canonical says it applies; certification and
                        `qforge ppl --artifact` run this way. Ignored with `reference` */
    qf_device device;
    qf_cuda_params cuda; /* CUDA backend knobs (ignored on the CPU) */
} qf_context_params;

QF_API qf_context_params qf_context_default_params(void);

typedef struct qf_context qf_context;

QF_API qf_context *qf_context_new(qf_model *m, const qf_context_params *p, qf_error *err);
QF_API void qf_context_free(qf_context *c);
QF_API const qf_context_params *qf_context_params_get(const qf_context *c);
QF_API qf_device qf_context_device(const qf_context *c); /* the device actually in use */
QF_API qf_model *qf_context_model(const qf_context *c);
/* True when c computes in the canonical arithmetic: params.canonical (not reference) and a model
 * and cache it covers: the llama / qwen2 layer (no MoE, per-head q/k norms, post norms, soft-
 * capping, sliding windows or embedding scale; SwiGLU) with K and V in f32, f16, q8_0, q4_0 (with
 * or without --kv-rot hadamard), kv-int8 or kv-rq rows (with its exact sinks and window).
 * Elsewhere (kv-dict, the other families) the canonical flag still picks the same kernels on the
 * CPU, but the GPU takes its own route. */
QF_API bool qf_context_canonical(const qf_context *c);

/* Run n tokens at positions [pos0, pos0+n) (the cache must already hold [0, pos0)); pos0 = 0
 * starts a new sequence (whatever the cache holds past pos0 is overwritten before it is read).
 * logits: NULL, or room for (n - logits_from) * n_vocab floats: the logits of tokens
 * logits_from .. n-1 of the batch (n - 1 = last token only, 0 = every token). */
QF_API qf_status qf_decode(qf_context *c, const int32_t *tokens, int n, int pos0, float *logits,
                    int logits_from, qf_error *err);
QF_API void qf_context_set_tap(qf_context *c, const qf_tap *tap); /* NULL turns capture off */

/* KV cache bytes per token (all layers, K+V) in the current storage modes. */
QF_API double qf_context_kv_bytes_per_token(const qf_context *c);

#endif
