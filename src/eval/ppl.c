/* ppl.c: the perplexity / KL-divergence oracle, computed exactly the way llama.cpp's
 * llama-perplexity computes it so the two can be compared number for number:
 *   - the whole text is tokenized once (BOS first when the vocabulary adds BOS);
 *   - it is cut into floor(n_tokens / n_ctx) chunks of n_ctx tokens; each chunk starts from an
 *     empty cache and, when the vocabulary adds BOS, its first token is replaced by BOS;
 *   - only the second half is scored: positions first = n_ctx/2 .. n_ctx-2 predict the next
 *     token, so each chunk contributes n_ctx - 1 - first negative log-likelihoods;
 *   - PPL = exp(mean nll), with the error estimate exp(mean) * sqrt(var / (count - 1)).
 * KL divergence compares against log-probabilities saved by an earlier (reference) run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#ifdef QF_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif
#include "qforge/ppl.h"
#include "util/util.h"

qf_ppl_params qf_ppl_default_params(void) {
    qf_ppl_params p = {0};
    p.n_ctx = 512;
    return p;
}

#include "ppl_kld.h"

/* log p(tok) under softmax(logits), as llama.cpp's log_softmax: f32 max, double sum of expf */
static double log_softmax_tok(const float *logits, int n_vocab, int tok) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - mx);
    return (double)(logits[tok] - mx) - log(sum);
}

/* The error for a NaN/Inf negative log-likelihood: a number that is not a result is never
 * averaged into one. Real weights never produce it; damaged ones (a tensor type relabelled
 * with sizes still consistent, NaN/Inf bit patterns in the data) do. */
static qf_status non_finite(qf_error *err, int chunk, int pos) {
    return qf_fail(err, QF_ERR_FORMAT,
                   "perplexity: the model produced non-finite logits (NaN/Inf) at chunk %d, position %d: "
                   "its weights are damaged or a tensor's type does not match its data", chunk + 1, pos);
}

static qf_status perplexity(qf_context *c, const int32_t *tokens, int64_t n_tokens, const qf_ppl_params *p,
                            const kld_base_file *base, qf_ppl_result *r, qf_error *err) {
    memset(r, 0, sizeof *r);
    const qf_model *m = c->model;
    const int n_vocab = m->hp.n_vocab, n_ctx = p->n_ctx;
    r->n_tokens_text = n_tokens;
    if (n_ctx < 2 || n_ctx > c->params.n_ctx)
        return qf_fail(err, QF_ERR_ARG, "perplexity: chunk size %d must be in [2, %d] (the context size)", n_ctx,
                       c->params.n_ctx);
    if (n_tokens < 2 * (int64_t)n_ctx)
        return qf_fail(err, QF_ERR_ARG,
                       "perplexity: you need at least %d tokens to evaluate perplexity with a context of %d; "
                       "the text tokenizes to only %lld tokens",
                       2 * n_ctx, n_ctx, (long long)n_tokens);
    if (n_ctx - 1 - n_ctx / 2 < 1)
        return qf_fail(err, QF_ERR_ARG,
                       "perplexity: a chunk of %d tokens scores no token (only the second half of each chunk "
                       "is scored); use a chunk size (-c) of at least 3", n_ctx);
    int n_chunk_max = (int)(n_tokens / n_ctx);
    int n_chunk = p->n_chunks > 0 && p->n_chunks < n_chunk_max ? p->n_chunks : n_chunk_max;
    const int first = n_ctx / 2, n_score = n_ctx - 1 - first;
    const bool add_bos = qf_tokenizer_add_bos(m->tok) && qf_tokenizer_bos(m->tok) >= 0;
    const int n_batch = c->n_batch < n_ctx ? c->n_batch : n_ctx;

    kld_state kl;
    qf_status st = kld_begin(&kl, p, n_ctx, n_vocab, n_chunk, base, tokens, err);
    if (st) {
        kld_end(&kl);
        return st;
    }

    float *logits = malloc((size_t)(n_ctx - first) * n_vocab * sizeof(float));
    int32_t *chunk = malloc((size_t)n_ctx * sizeof(int32_t));
    if (!logits || !chunk) {
        free(logits), free(chunk);
        kld_end(&kl);
        return qf_fail(err, QF_ERR_NOMEM, "perplexity: out of memory for %d x %d logits", n_ctx - first, n_vocab);
    }
    double nll = 0, nll2 = 0;
    int64_t count = 0;
#ifdef QF_HAVE_CUDA
    double *gpu_nll = c->gpu ? malloc((size_t)n_score * sizeof(double)) : NULL;
    if (c->gpu && !gpu_nll) {
        free(logits), free(chunk);
        kld_end(&kl);
        return qf_fail(err, QF_ERR_NOMEM, "perplexity: out of memory");
    }
#endif
    qf_progress bar;
    if (p->progress) qf_progress_begin(&bar, "ppl", n_chunk);
    double t0 = qf_now_sec();
    for (int i = 0; i < n_chunk && !st; i++) {
        memcpy(chunk, tokens + (size_t)i * n_ctx, (size_t)n_ctx * sizeof(int32_t));
        if (add_bos) chunk[0] = qf_tokenizer_bos(m->tok);
        qf_context_kv_clear(c);
        const int32_t *next = tokens + (size_t)i * n_ctx + first + 1;
#ifdef QF_HAVE_CUDA
        /* on the GPU without KL divergence the scores are computed on the device: no logits
         * cross to the host (the same log-softmax as log_softmax_tok) */
        if (c->gpu && !kl.reading && !kl.writing && n_batch >= n_ctx) {
            st = qf_cuda_decode_nll(c, chunk, n_ctx - 1, 0, first, next, gpu_nll, err);
            if (st) break;
            for (int k = 0; k < n_score && !st; k++) {
                if (!isfinite(gpu_nll[k])) st = non_finite(err, i, first + k);
                nll += gpu_nll[k], nll2 += gpu_nll[k] * gpu_nll[k];
            }
            if (st) break;
            count += n_score;
            goto chunk_done;
        }
#endif
        for (int j = 0; j < n_ctx && !st; j += n_batch) {
            int bs = n_ctx - j < n_batch ? n_ctx - j : n_batch;
            int from = first - j > 0 ? first - j : 0; /* first batch row that needs logits */
            float *dst = from < bs ? logits + (size_t)(j + from - first) * n_vocab : NULL;
            st = qf_decode(c, chunk + j, bs, j, dst, from, err);
        }
        if (st) break;
        for (int k = 0; k < n_score && !st; k++) {
            double v = -log_softmax_tok(logits + (size_t)k * n_vocab, n_vocab, next[k]);
            if (!isfinite(v)) st = non_finite(err, i, first + k);
            nll += v;
            nll2 += v * v;
        }
        if (st) break;
        count += n_score;
        st = kld_chunk(&kl, logits, next, n_score, err);
#ifdef QF_HAVE_CUDA
    chunk_done:
#endif
        if (p->log) {
            fprintf(p->log, "[%d]%.4lf,", i + 1, exp(nll / (double)count));
            fflush(p->log);
        }
        if (p->progress) qf_progress_update(&bar, i + 1);
    }
    double secs = qf_now_sec() - t0;
    if (p->progress) qf_progress_end(&bar);
    if (p->log) fputc('\n', p->log);
    free(logits);
    free(chunk);
#ifdef QF_HAVE_CUDA
    free(gpu_nll);
#endif
    if (!st) st = kld_finish(&kl, r, err);
    kld_end(&kl);
    if (st) return st;

    if (count == 0) return qf_fail(err, QF_ERR_ARG, "perplexity: no token was scored");
    r->n_chunks = n_chunk;
    r->n_scored = count;
    r->nll_mean = nll / (double)count;
    r->ppl = exp(r->nll_mean);
    double var = nll2 / (double)count - r->nll_mean * r->nll_mean;
    r->ppl_err = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) * r->ppl : 0;
    r->seconds = secs;
    r->tokens_per_sec = secs > 0 ? (double)n_chunk * n_ctx / secs : 0;
    return QF_OK;
}

/* A base file is only comparable with the run that asks for it: the same chunk size (p->n_ctx,
 * when > 0) and, when the caller has the text's tokens, the same tokens (the base stores the
 * n_chunk * n_ctx tokens it scored; the text must start with exactly those). QF_ERR_ARG otherwise. */
static qf_status kld_base_matches(const kld_base_file *b, const qf_ppl_params *p, const int32_t *tokens,
                                  int64_t n_tokens, qf_error *err) {
    if (p->n_ctx > 0 && p->n_ctx != b->n_ctx)
        return qf_fail(err, QF_ERR_ARG, "%s: the KL base was made with a chunk size (-c) of %d, this run uses %d",
                       p->kl_base_read, b->n_ctx, p->n_ctx);
    if (!tokens) return QF_OK;
    int64_t need = (int64_t)b->n_ctx * b->n_chunk;
    if (n_tokens < need)
        return qf_fail(err, QF_ERR_ARG, "%s: the KL base was made from another text (%lld tokens scored; this text "
                       "has %lld)", p->kl_base_read, (long long)need, (long long)n_tokens);
    for (int64_t i = 0; i < need; i++)
        if (b->tokens[i] != tokens[i])
            return qf_fail(err, QF_ERR_ARG, "%s: the KL base was made from another text (token %lld differs)",
                           p->kl_base_read, (long long)i);
    return QF_OK;
}

/* With kl_base_read the tokens and the chunk size come from the base file, as llama.cpp does,
 * once kld_base_matches has checked that they are those of this run. */
static qf_status perplexity_kl(qf_context *c, const int32_t *tokens, int64_t n_tokens, const qf_ppl_params *p,
                               qf_ppl_result *r, qf_error *err) {
    if (!p->kl_base_read) return perplexity(c, tokens, n_tokens, p, NULL, r, err);
    kld_base_file base;
    qf_status st = kld_base_open(&base, p->kl_base_read, err);
    if (st) return st;
    if ((st = kld_base_matches(&base, p, tokens, n_tokens, err))) {
        qf_unmap_file(&base.mf);
        return st;
    }
    qf_ppl_params q = *p;
    q.n_ctx = base.n_ctx;
    q.n_chunks = p->n_chunks > 0 && p->n_chunks < base.n_chunk ? p->n_chunks : base.n_chunk;
    st = perplexity(c, base.tokens, (int64_t)base.n_ctx * base.n_chunk, &q, &base, r, err);
    qf_unmap_file(&base.mf);
    return st;
}

qf_status qf_perplexity(qf_context *c, const int32_t *tokens, int64_t n_tokens,
                        const qf_ppl_params *p, qf_ppl_result *r, qf_error *err) {
    return perplexity_kl(c, tokens, n_tokens, p, r, err);
}

qf_status qf_perplexity_text(qf_context *c, const char *text, size_t len, const qf_ppl_params *p,
                             qf_ppl_result *r, qf_error *err) {
    const qf_tokenizer *tok = c->model->tok;
    int32_t *ids = NULL;
    size_t n = 0;
    qf_status st = qf_tokenize(tok, text, len, qf_tokenizer_add_bos(tok), false, &ids, &n, err);
    if (st) return st;
    st = perplexity_kl(c, ids, (int64_t)n, p, r, err);
    free(ids);
    return st;
}
