/* run.c: the run setup every command shares (model, verified artifact, context with its
 * defaults resolved once, binding) and the generation loop `qforge generate` streams. */
#include "qforge/run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gpu.h"
#include "engine/sample.h"
#include "qforge/artifact_bind.h"
#include "util/util.h"

qf_run_params qf_run_default_params(void) {
    qf_run_params p;
    memset(&p, 0, sizeof p);
    p.cp = qf_context_default_params();
    p.cp.n_ctx = 0; /* the model's own context, resolved by the context (forward.c) */
    return p;
}

void qf_run_close(qf_run *r) {
    if (!r) return;
    qf_context_free(r->ctx);
    if (r->has_artifact) qf_artifact_free(&r->artifact);
    qf_model_free(r->model);
    memset(r, 0, sizeof *r);
}

qf_status qf_run_open(const qf_run_params *p, qf_run *r, qf_error *err) {
    memset(r, 0, sizeof *r);
    if (!p->model_path) return qf_fail(err, QF_ERR_ARG, "no model given");
    if (p->trust_key && !p->artifact_path) return qf_fail(err, QF_ERR_ARG, "a trust key needs an artifact");
    qf_status st = QF_OK;
    if (!(r->model = qf_model_load(p->model_path, err))) {
        st = err ? err->code : QF_ERR_IO;
        goto fail;
    }
    /* an artifact is verified against this exact model file before anything runs */
    if (p->artifact_path) {
        if ((st = qf_artifact_load(p->artifact_path, qf_model_sha256(r->model), p->trust_key, &r->artifact, err)))
            goto fail;
        r->has_artifact = true;
    }
    /* the one place a run's context is made: n_ctx 0 and n_batch 0 are resolved by
     * qf_context_new and read back from the context by everyone after; an artifact caps the
     * default at the largest context it is certified at and refuses a larger one */
    qf_context_params cp = p->cp;
    if (r->has_artifact) {
        r->certified_ctx = qf_artifact_max_certified_ctx(&r->artifact);
        if (cp.n_ctx <= 0) {
            const qf_hparams *hp = qf_model_hparams(r->model);
            cp.n_ctx = hp->n_ctx_train > 0 ? hp->n_ctx_train : 2048;
            if (r->certified_ctx > 0 && r->certified_ctx < cp.n_ctx) cp.n_ctx = r->certified_ctx;
        }
        if ((st = qf_artifact_check_ctx(&r->artifact, cp.n_ctx, p->force_uncertified_ctx, &r->uncertified_ctx, err)))
            goto fail;
    }
    /* kv-dict v2 runs on the CPU only: --device auto picks it (an explicit cuda is refused on binding) */
    if (r->has_artifact && cp.device == QF_DEVICE_AUTO && qf_artifact_cpu_only(&r->artifact)) cp.device = QF_DEVICE_CPU;
    if (!(r->ctx = qf_context_new(r->model, &cp, err))) {
        st = err ? err->code : QF_ERR_NOMEM;
        goto fail;
    }
    /* bound in place: r->artifact outlives r->ctx (qf_run_close frees the context first), so a
     * kv-rq cache reads the V predictor and format 3's transforms from the payload instead of
     * holding a second copy (168 MB at the Llama-3-8B shape) */
    if (r->has_artifact && ((st = qf_artifact_check(&r->artifact, qf_model_sha256(r->model), err)) ||
                            (st = qf_context_bind_payload_in_place(r->ctx, r->artifact.cert.kind, &r->artifact.payload, err))))
        goto fail;
    return QF_OK;
fail:
    qf_run_close(r);
    return st ? st : QF_ERR_NOMEM;
}

/* Logits with a NaN/Inf come from damaged weights (or a tensor type that does not match its
 * data); sampling them would print garbage as if it were text. */
static qf_status nonfinite_fail(qf_error *err) {
    return qf_fail(err, QF_ERR_FORMAT, "the model produced non-finite logits (NaN/Inf): its weights are "
                                       "damaged or a tensor's type does not match its data");
}
static qf_status logits_finite(const float *logits, int n, qf_error *err) {
    for (int i = 0; i < n; i++)
        if (!isfinite(logits[i])) return nonfinite_fail(err);
    return QF_OK;
}

qf_status qf_generate(qf_context *c, const char *prompt, size_t len, const qf_generate_params *p,
                      qf_generate_stats *stats, qf_error *err) {
    qf_generate_stats s;
    memset(&s, 0, sizeof s);
    const qf_model *m = qf_context_model(c);
    const qf_tokenizer *tok = qf_model_tokenizer(m);
    const int n_ctx = qf_context_params_get(c)->n_ctx, n_batch = qf_context_params_get(c)->n_batch;
    const int n_vocab = qf_model_hparams(m)->n_vocab;
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    float *logits = NULL;
    qf_sampler smp;
    memset(&smp, 0, sizeof smp);
    qf_status st = qf_tokenize(tok, prompt, len, qf_tokenizer_add_bos(tok), false, &ids, &n_prompt, err);
    if (st) goto done;
    if (n_prompt == 0) {
        st = qf_fail(err, QF_ERR_ARG, "the prompt tokenizes to nothing");
        goto done;
    }
    if ((int64_t)n_prompt >= n_ctx) {
        st = qf_fail(err, QF_ERR_ARG, "the prompt has %zu tokens, more than the context size %d", n_prompt, n_ctx);
        goto done;
    }
    s.n_prompt = (int)n_prompt;
    logits = malloc((size_t)n_vocab * sizeof(float));
    if (!logits || qf_sampler_init(&smp, &p->sampler, n_vocab)) {
        st = qf_fail(err, QF_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (p->on_text) p->on_text(p->user, prompt, len);
    double t0 = qf_now_sec();
    int pos = 0;
    for (size_t i = 0; i < n_prompt; i += (size_t)n_batch) {
        int bs = (int)(n_prompt - i) < n_batch ? (int)(n_prompt - i) : n_batch;
        bool last = i + (size_t)bs == n_prompt;
        if ((st = qf_decode(c, ids + i, bs, pos, last ? logits : NULL, bs - 1, err))) goto done;
        pos += bs;
    }
    if ((st = logits_finite(logits, n_vocab, err))) goto done;
    double t1 = qf_now_sec();
    s.prompt_seconds = t1 - t0;
    char piece[256];
    /* on the GPU the step's logits are reduced there for the sampler (max, sum, top-k: 2 KB
     * instead of the whole row) and qf_sample_candidates finishes the draw: the same tokens as
     * qf_sample on the copied row, up to the last bits of the device's sum */
    const bool dev = qf_gpu_topk_ok(c, &p->sampler);
    qf_gpu_topk r; /* dev: the last step's reduction (the first token is drawn from the prompt's row) */
    for (; s.n_generated < p->n_predict && pos < n_ctx; s.n_generated++) {
        int32_t next = !dev || s.n_generated == 0 ? qf_sample(&smp, logits)
                       : p->sampler.temp <= 0     ? r.argmax
                                                  : qf_sample_candidates(&smp, r.id, r.logit, r.n, r.lmax, r.sum);
        if (next == qf_tokenizer_eos(tok)) break;
        int n = qf_token_to_piece(tok, next, false, piece, sizeof piece);
        if (n > 0 && p->on_text) p->on_text(p->user, piece, (size_t)(n < (int)sizeof piece ? n : (int)sizeof piece));
        if (dev) {
            if ((st = qf_gpu_decode_topk(c, next, pos, p->sampler.temp, p->sampler.top_k, &r, err))) goto done;
            if (r.n_nonfinite) {
                st = nonfinite_fail(err);
                goto done;
            }
        } else if ((st = qf_decode(c, &next, 1, pos, logits, 0, err)) || (st = logits_finite(logits, n_vocab, err)))
            goto done;
        pos++;
    }
    s.gen_seconds = qf_now_sec() - t1;
    s.context_full = s.n_generated < p->n_predict && pos >= n_ctx;
done:
    if (stats) *stats = s;
    qf_sampler_free(&smp);
    free(logits);
    free(ids);
    return st;
}
