/* qforge/artifact_bind.h: run a certified KV artifact in an inference context.
 *
 * A context is created in a plain KV mode (f32, f16, ...). Binding a kv-int8 artifact
 * rebuilds its KV cache as int8 with the artifact's static per-channel scales; binding a
 * kv-dict artifact rebuilds it as sparse codes (atom indices + coefficients per row, OMP
 * encoded on write, reconstructed on read) against the artifact's per-layer dictionaries.
 * Unbinding restores the modes the context was created with. Cache contents are dropped
 * either way (clear the positions you run next, as perplexity and generation do).
 * On a GPU context the device cache is rebuilt the same way (scales and dictionaries uploaded).
 *
 * Payloads (what the forge's pipeline writes, docs/forge.md):
 *   kv-int8  "k_scale", "v_scale": f32 [n_layer, n_head_kv, head_dim] (per channel) or
 *            [n_layer, n_head_kv] (one scale per head slot), every scale finite and > 0;
 *            optional "k_layout", "v_layout": "static" (the default: x / scale), "static-rot"
 *            (the same on Walsh-Hadamard rotated rows), "token-rot" (rotated rows, each with
 *            its own scale carried in the codes: the scales are unused), "token". The GPU
 *            cache runs the static layout only (binding another there is Unsupported).
 *   kv-dict  "n_atoms" int, "sparsity" int, "coef" string ("f16" or "q8"), and per layer l
 *            "k.<l>", "v.<l>": f32 [n_atoms, head_dim] (atoms, re-normalised on binding).
 *            Version 2 adds "version" 2 (absent = 1), "k_prerope" int (keys learned and
 *            stored before RoPE, rotated on read), bit-packed indices (ceil(log2 n_atoms) bits
 *            each) and optional "k_tol", "v_tol": f32 [n_layer] error bounds (error-bounded
 *            OMP, rows still sized at the sparsity cap). v2 runs on the CPU only. */
#ifndef QFORGE_ARTIFACT_BIND_H
#define QFORGE_ARTIFACT_BIND_H

#include "qforge/api.h"
#include <stdbool.h>

#include "qforge/artifact.h"
#include "qforge/model.h"

/* Bind a loaded artifact. It is checked again here (qf_artifact_check against the SHA-256
 * of the context's model, and its gate), so only an artifact certified for this exact model
 * runs: QF_ERR_ARTIFACT_WRONG_MODEL / QF_ERR_ARTIFACT_NOT_CERTIFIED otherwise. An awq
 * artifact is not a KV artifact (QF_ERR_UNSUPPORTED: load the GGUF it names instead). */
QF_API qf_status qf_context_bind_artifact(qf_context *c, const qf_artifact *a, qf_error *err);

/* The certifier's entry: bind a candidate payload that has no certificate yet. Same binding
 * code as above (so the certified numbers are those of the artifact's real run), no check. */
QF_API qf_status qf_context_bind_payload(qf_context *c, qf_artifact_kind kind, const qf_payload *p,
                                  qf_error *err);

/* qf_context_bind_payload without copying a kv-rq payload's largest arrays (the V predictor,
 * format 3's transforms and levels: 185 MB at the Llama-3-8B shape): the CPU cache reads them
 * from p, so p must stay alive and unchanged until the context is unbound (successfully), bound again or
 * freed. They are checked all the same. The certifier's loops bind one fit dozens of times
 * this way (certify.c); other kinds bind as qf_context_bind_payload does. */
QF_API qf_status qf_context_bind_payload_in_place(qf_context *c, qf_artifact_kind kind, const qf_payload *p,
                                                  qf_error *err);

/* Back to the KV modes the context was created with (a no-op when nothing is bound). Fails
 * only when the cache cannot be reallocated (QF_ERR_NOMEM; the binding then stays). */
QF_API qf_status qf_context_unbind(qf_context *c, qf_error *err);

/* Bits per KV element of a KV artifact's payload on a model with these hparams, run at context
 * n_ctx, every per-token overhead included: codes, per-row or per-token scales, sink and window
 * rows amortized over n_ctx. Fixed per-model tables (static scales, dictionaries) are not
 * counted (they do not grow with the context). Each kind provides its own function (one case
 * below per kind in artifact_bind.c); NaN for awq, a kind without one, or a payload that does
 * not fit the model. q8_0 is 8.5 on this scale, q4_0 4.5, f16 16. */
QF_API double qf_artifact_bits_per_element(qf_artifact_kind kind, const qf_payload *p, const qf_hparams *hp,
                                    int n_ctx);

/* Bytes of a KV artifact's fixed per-model tables: every array of its payload (f32 entries 4
 * bytes an element, u8 / i8 entries 1), i.e. what qf_artifact_bits_per_element leaves out
 * (kv-int8's static scales, kv-dict's atoms, kv-rq's codebooks, format 3's transforms and the V
 * predictor). The cache holds them once per context, whatever its length, so against a free
 * cache type of b bits they pay off from n_ctx >= table_bytes * 8 / (elements per token * (b -
 * rate)). NaN for awq (a weight artifact) or a NULL payload. */
QF_API double qf_artifact_table_bytes(qf_artifact_kind kind, const qf_payload *p);

/* True for artifacts only the CPU route runs (kv-dict payload version 2): a caller creating
 * the context with QF_DEVICE_AUTO should pick QF_DEVICE_CPU for them. */
QF_API bool qf_artifact_cpu_only(const qf_artifact *a);

/* Whether an artifact is bound, and which kind (kind may be NULL). */
QF_API bool qf_context_bound(const qf_context *c, qf_artifact_kind *kind);

#endif
