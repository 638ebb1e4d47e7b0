/* qforge/run.h: what every command that runs a model sets up, written once: open the model,
 * load and verify a KV artifact against that exact model file, create the inference context
 * (its defaults resolved here and nowhere else), bind the artifact; and the generation loop
 * (prompt prefill in batches, then sample / decode one token at a time).
 *
 *   qf_run_params p = qf_run_default_params();
 *   p.model_path = "model.gguf";
 *   qf_run r;
 *   if (qf_run_open(&p, &r, &err)) ...;        // r.model, r.ctx ready (artifact bound)
 *   qf_generate(r.ctx, prompt, strlen(prompt), &gp, &stats, &err);
 *   qf_run_close(&r);
 */
#ifndef QFORGE_RUN_H
#define QFORGE_RUN_H

#include <stdbool.h>
#include <stddef.h>

#include "qforge/artifact.h"
#include "qforge/api.h"
#include "qforge/error.h"
#include "qforge/model.h"
#include "qforge/sample.h"

typedef struct {
    const char *model_path;    /* required */
    const char *artifact_path; /* NULL: the KV cache runs in cp.kv_k / cp.kv_v */
    const char *trust_key;     /* NULL, or the Ed25519 public key (PEM) the artifact must be signed by */
    /* The context. n_ctx 0 = the model's training context (2048 when the file has none);
     * n_batch 0 (or more than n_ctx) = n_ctx; n_threads 0 = all cores. */
    qf_context_params cp;
    /* With an artifact: n_ctx 0 = the model's context capped at the largest context the artifact
     * is certified at; a larger n_ctx is refused (QF_ERR_ARTIFACT_NOT_CERTIFIED) unless this is
     * set, when the run goes on with qf_run.uncertified_ctx set (say so). */
    bool force_uncertified_ctx;
} qf_run_params;

/* qf_context_default_params() with n_ctx 0 (the model's context), no artifact. */
QF_API qf_run_params qf_run_default_params(void);

typedef struct {
    qf_model *model;
    qf_context *ctx;      /* its params (qf_context_params_get) hold the resolved defaults */
    qf_artifact artifact; /* loaded and verified when has_artifact; the context reads its payload in place
                           * (qf_context_bind_payload_in_place): leave it unchanged while ctx lives */
    bool has_artifact;
    bool uncertified_ctx; /* forced above the artifact's certified context */
    int certified_ctx;    /* the artifact's largest certified context (0: none recorded) */
} qf_run;

/* Open p->model_path, load p->artifact_path (verified against the SHA-256 of this exact model
 * file and its certificate's gate, signature required when p->trust_key is set) BEFORE
 * anything runs, check the context against the contexts it is certified at (see
 * force_uncertified_ctx), create the context and bind the artifact. On failure everything is
 * released and *r is zeroed. Errors: QF_ERR_ARG (no model path, a trust key without an artifact,
 * bad context params), the model loader's (QF_ERR_IO / _FORMAT / _UNSUPPORTED), the artifact's
 * (QF_ERR_ARTIFACT_*, QF_ERR_ARTIFACT_NOT_CERTIFIED for an uncertified context), QF_ERR_NOMEM. */
QF_API qf_status qf_run_open(const qf_run_params *p, qf_run *r, qf_error *err);
/* Release what qf_run_open made (safe on a zeroed or already closed *r). */
QF_API void qf_run_close(qf_run *r);

/* ---- generation ---- */

typedef struct {
    int n_predict;             /* tokens to generate at most (0: none); stops early at end-of-text
                                  or when the context is full */
    qf_sampler_params sampler; /* temperature, top-k, top-p, seed: a seed reproduces the text */
    /* Receives the prompt once (after it was checked, before it is evaluated), then the text
     * of every generated token as it comes (at most 256 bytes a piece). May be NULL. */
    void (*on_text)(void *user, const char *text, size_t len);
    void *user;
} qf_generate_params;

typedef struct {
    int n_prompt;          /* prompt tokens (BOS included when the vocabulary adds it) */
    int n_generated;       /* tokens sampled and fed back (end-of-text not counted) */
    double prompt_seconds; /* prompt prefill */
    double gen_seconds;    /* sampling + decoding of the generated tokens */
    bool context_full;     /* stopped before n_predict because the context was full */
} qf_generate_stats;

/* Tokenize `prompt` (BOS first when the vocabulary adds it), evaluate it from position 0 in
 * batches of the context's n_batch, then sample and decode up to n_predict tokens. The cache
 * positions used are overwritten. stats (may be NULL) is filled as far as it got. On a GPU
 * context with greedy sampling or a top-k of 1..256 the logits are reduced on the device and
 * only their top-k come back (the same tokens as sampling the whole row, up to the last bits of
 * the softmax's sum).
 * Errors: QF_ERR_ARG when the prompt tokenizes to nothing or does not fit the context (it must
 * leave at least one position), QF_ERR_FORMAT when the model produces non-finite logits (damaged
 * weights: nothing garbled is sampled), the tokenizer's and the decoder's errors, QF_ERR_NOMEM. */
QF_API qf_status qf_generate(qf_context *c, const char *prompt, size_t len, const qf_generate_params *p,
                      qf_generate_stats *stats, qf_error *err);

#endif
