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
#include "engine/gpu.h"
#include "eval/kld.h"
#include "kernels/vecmath.h"
#include "qforge/ppl.h"
#include "util/par.h"
#include "util/util.h"

qf_ppl_params qf_ppl_default_params(void) {
    qf_ppl_params p = {0};
    p.n_ctx = 512;
    return p;
}

/* log p(tok) under softmax(logits), as llama.cpp's log_softmax: f32 max, double sum of exp. The
 * reference route (and a CPU without AVX2) sums expf in order, llama.cpp's exact arithmetic; the fast
 * route the AVX2 exp in 8 double lanes (kernels/vecmath.h: within ~1e-7 relative of the sum, ~1e-7 of
 * a nats-sized NLL; the 1B f16's two-chunk PPL moved in the 7th digit) */
static double log_softmax_tok(const float *logits, int n_vocab, int tok, bool ref) {
    float mx = ref ? qf_vec_max_ref(logits, n_vocab) : qf_vec_max(logits, n_vocab);
    double sum = ref ? qf_vec_sum_exp_ref(logits, n_vocab, mx) : qf_vec_sum_exp(logits, n_vocab, mx);
    return (double)(logits[tok] - mx) - log(sum);
}

/* The scored rows' log-softmax, split over the context's thread pool by rows: each row is
 * log_softmax_tok exactly, so the result does not depend on the number of threads. */
typedef struct {
    const float *logits;
    const int32_t *next;
    double *nll;
    int n_vocab, n;
    bool ref; /* the reference route's arithmetic (log_softmax_tok) */
} nll_job;

static void nll_worker(void *arg, int ith, int nth) {
    nll_job *j = arg;
    int64_t k0, k1;
    qf_split_range(j->n, ith, nth, &k0, &k1);
    for (int64_t k = k0; k < k1; k++)
        j->nll[k] = -log_softmax_tok(j->logits + (size_t)k * j->n_vocab, j->n_vocab, j->next[k], j->ref);
}

/* The error for a NaN/Inf negative log-likelihood: a number that is not a result is never
 * averaged into one. Real weights never produce it; damaged ones (a tensor type relabelled
 * with sizes still consistent, NaN/Inf bit patterns in the data) do. */
static qf_status non_finite(qf_error *err, int chunk, int pos) {
    return qf_fail(err, QF_ERR_FORMAT,
                   "perplexity: the model produced non-finite logits (NaN/Inf) at chunk %d, position %d: "
                   "its weights are damaged or a tensor's type does not match its data", chunk + 1, pos);
}

/* The sharded loop (docs/mpi.md): chunk i runs on rank i % N, in rounds of N chunks. Each
 * chunk's results travel as one fixed-size record: its n_score negative log-likelihoods
 * (double), its KL positions (reading) and its encoded base rows (writing, unless each rank
 * keeps its own local base file). Each rank runs its chunks of a window of rounds
 * (ppl_window_rounds: up to 8 rounds, fewer when the records are wide) without meeting the others;
 * then the records are gathered to rank 0, which adds them in chunk order, exactly the
 * additions one process makes, prints the running value and writes the rows; so every
 * printed digit is the same for any N. With one rank this is the plain loop. A failure on any
 * rank is agreed at the end of the window and returned on every rank, naming the rank. */
typedef struct {
    qf_context *c;
    const int32_t *tokens;
    int n_ctx, n_vocab, first, n_score, n_batch;
    bool add_bos, gpu_scores;
    float *logits;
    int32_t *chunk;
    size_t off_pos, off_rows, rec_bytes;
} ppl_run;

/* run chunk i (this rank's own_idx-th) into its record */
static qf_status ppl_chunk(ppl_run *u, qf_kld_state *kl, int i, int own_idx, uint8_t *rec, qf_error *err) {
    qf_context *c = u->c;
    const qf_model *m = c->model;
    const int n_ctx = u->n_ctx, first = u->first, n_batch = u->n_batch;
    double *nll = (double *)(void *)rec;
    memcpy(u->chunk, u->tokens + (size_t)i * n_ctx, (size_t)n_ctx * sizeof(int32_t));
    if (u->add_bos) u->chunk[0] = qf_tokenizer_bos(m->tok);
    const int32_t *next = u->tokens + (size_t)i * n_ctx + first + 1;
    qf_status st = QF_OK;
    /* on the GPU without KL divergence the scores are computed on the device: no logits
     * cross to the host (the same log-softmax as log_softmax_tok) */
    if (u->gpu_scores) {
        if ((st = qf_decode_nll(c, u->chunk, n_ctx - 1, 0, first, next, nll, err))) return st;
        for (int k = 0; k < u->n_score; k++)
            if (!isfinite(nll[k])) return non_finite(err, i, first + k);
        return QF_OK;
    }
    /* the chunk's last token predicts nothing that is scored: n_ctx - 1 tokens are evaluated
     * (its logits row would be dropped; llama.cpp evaluates it and drops it) */
    const int n_eval = n_ctx - 1;
    for (int j = 0; j < n_eval && !st; j += n_batch) {
        int bs = n_eval - j < n_batch ? n_eval - j : n_batch;
        int from = first - j > 0 ? first - j : 0; /* first batch row that needs logits */
        float *dst = from < bs ? u->logits + (size_t)(j + from - first) * u->n_vocab : NULL;
        st = qf_decode(c, u->chunk + j, bs, j, dst, from, err);
    }
    if (st) return st;
    nll_job nj = {.logits = u->logits, .next = next, .nll = nll, .n_vocab = u->n_vocab, .n = u->n_score,
                  .ref = c->params.reference};
    qf_pool_run(c->pool, nll_worker, &nj);
    for (int k = 0; k < u->n_score; k++)
        if (!isfinite(nll[k])) return non_finite(err, i, first + k);
    return qf_kld_chunk(kl, u->logits, next, u->n_score, kl->local ? own_idx : i,
                     kl->writing && !kl->local ? (uint16_t *)(void *)(rec + u->off_rows) : NULL,
                     (qf_kld_pos *)(void *)(rec + u->off_pos), c->pool, err);
}

/* Rounds per window of the sharded loop: how many of its chunks a rank runs before the records
 * are gathered to rank 0. One process: 1 (its running output appears chunk by chunk, as
 * before). Several: up to PPL_WINDOW_MAX rounds, fewer when their records would exceed 256 MiB
 * on rank 0 (only a base file written through rank 0 has wide records: n_vocab rows), so the
 * ranks meet once per 8 rounds instead of once per round, and a long run still shows its
 * running output and progress every 8 x N chunks. The rounds and the order of the additions
 * do not change, so neither does any printed digit. */
#define PPL_WINDOW_MAX 8
static int ppl_window_rounds(int n_rank, int n_round, size_t rec_bytes) {
    if (n_rank <= 1 || n_round <= 1) return 1;
    /* QF_PPL_WINDOW_ROUNDS=k forces windows of k rounds (tests/cli_mpi.sh: any window gives
     * the same bytes); the same value must reach every rank (mpirun passes the environment) */
    const char *force = getenv("QF_PPL_WINDOW_ROUNDS");
    if (force && atoi(force) > 0) return atoi(force) < n_round ? atoi(force) : n_round;
    const size_t budget = (size_t)256 << 20;
    size_t per_round = rec_bytes * (size_t)n_rank, w = per_round ? budget / per_round : (size_t)n_round;
    if (w < 1) w = 1;
    if (w > PPL_WINDOW_MAX) w = PPL_WINDOW_MAX;
    return w < (size_t)n_round ? (int)w : n_round;
}

static qf_status perplexity(qf_context *c, const int32_t *tokens, int64_t n_tokens, const qf_ppl_params *p,
                            const qf_kld_base_file *base, qf_ppl_result *r, qf_error *err) {
    memset(r, 0, sizeof *r);
    const qf_model *m = c->model;
    const int n_vocab = m->hp.n_vocab, n_ctx = p->n_ctx;
    const int n_rank = qf_mpi_size(), rank = qf_mpi_rank();
    r->n_tokens_text = n_tokens;
    /* the same inputs give the same refusal on every rank: no collective needed yet */
    if (n_ctx < 2 || n_ctx > c->params.n_ctx)
        return qf_fail(err, QF_ERR_ARG, "perplexity: chunk size %d must be in [2, %d] (the context size)", n_ctx,
                       c->params.n_ctx);
    /* llama.cpp asks a text for two chunks; a base file's tokens are exactly the chunks it
     * scored (--eval-chunks 1 / --chunks 1 leaves one), so one chunk is enough there */
    if (n_tokens < (base ? 1 : 2) * (int64_t)n_ctx)
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
    int n_own = n_chunk / n_rank + (rank < n_chunk % n_rank);

    ppl_run u = {.c = c, .tokens = tokens, .n_ctx = n_ctx, .n_vocab = n_vocab, .first = first, .n_score = n_score};
    u.add_bos = qf_tokenizer_add_bos(m->tok) && qf_tokenizer_bos(m->tok) >= 0;
    u.n_batch = c->n_batch < n_ctx ? c->n_batch : n_ctx;

    qf_kld_state kl;
    uint8_t *rec = NULL, *all = NULL;
    qf_status st = qf_kld_begin(&kl, p, n_ctx, n_vocab, n_chunk, n_own, base, tokens, err);
    /* (not in the canonical arithmetic: its scores are the host's log_softmax_tok of the same
     * logits on every device) */
    u.gpu_scores = qf_context_device(c) == QF_DEVICE_CUDA && !kl.reading && !kl.writing && u.n_batch >= n_ctx &&
                   !c->params.canonical;
    u.off_pos = (size_t)n_score * sizeof(double);
    u.off_rows = u.off_pos + (kl.reading ? (size_t)n_score * sizeof(qf_kld_pos) : 0);
    u.rec_bytes = u.off_rows + (kl.writing && !kl.local ? (size_t)n_score * kl.nv * sizeof(uint16_t) : 0);
    int n_round = (n_chunk + n_rank - 1) / n_rank;
    const int win = ppl_window_rounds(n_rank, n_round, u.rec_bytes);
    if (!st) {
        u.logits = malloc((size_t)(n_ctx - first) * n_vocab * sizeof(float));
        u.chunk = malloc((size_t)n_ctx * sizeof(int32_t));
        rec = calloc((size_t)win, u.rec_bytes);
        all = rank == 0 ? malloc(u.rec_bytes * (size_t)win * (size_t)n_rank) : NULL;
        if (!u.logits || !u.chunk || !rec || (rank == 0 && !all))
            st = qf_fail(err, QF_ERR_NOMEM, "perplexity: out of memory for %d x %d logits", n_ctx - first, n_vocab);
    }
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    qf_progress bar;
    bool bar_on = p->progress && rank == 0, agreed = false;
    /* every rank is ready (or all learn why not) before the clock starts: a rank that loads
     * its model later does not count as evaluation time */
    if ((st = qf_par_agree(st, err))) agreed = true;
    if (bar_on) qf_progress_begin(&bar, "ppl", n_chunk);
    double t0 = qf_now_sec();
    for (int w0 = 0; w0 < n_round && !agreed; w0 += win) {
        const int nr = n_round - w0 < win ? n_round - w0 : win; /* rounds in this window: equal on every rank */
        /* this rank's chunks of the window, with no collective in between: a rank never
         * waits for another until the window ends */
        for (int k = 0; k < nr && !st; k++) {
            int i = (w0 + k) * n_rank + rank;
            if (i >= n_chunk) break;
            st = qf_par_injected("perplexity", err);
            if (!st) st = ppl_chunk(&u, &kl, i, w0 + k, rec + (size_t)k * u.rec_bytes, err);
        }
        if ((st = qf_par_agree(st, err))) {
            agreed = true;
            break;
        }
        /* rank q's block holds its records of rounds w0 .. w0+nr-1; rank 0 adds them in chunk order */
        const size_t blk = (size_t)nr * u.rec_bytes;
        if ((st = qf_par_gather(rec, blk, all, err))) break;
        for (int k = 0; k < nr && rank == 0 && !st; k++) {
            for (int q = 0; q < n_rank && !st; q++) {
                int ci = (w0 + k) * n_rank + q;
                if (ci >= n_chunk) break;
                const uint8_t *cr = all + (size_t)q * blk + (size_t)k * u.rec_bytes;
                const double *v = (const double *)(const void *)cr;
                double cn = 0;
                for (int j = 0; j < n_score; j++) {
                    nll += v[j];
                    nll2 += v[j] * v[j];
                    cn += v[j];
                }
                if (p->chunk_nll && ci < p->chunk_nll_cap) p->chunk_nll[ci] = cn / n_score;
                count += n_score;
                if (kl.reading) qf_kld_accumulate(&kl, (const qf_kld_pos *)(const void *)(cr + u.off_pos), n_score);
                if (kl.writing && !kl.local)
                    st = qf_kld_write_rows(&kl, (const uint16_t *)(const void *)(cr + u.off_rows), n_score, err);
                if (p->log) {
                    fprintf(p->log, "[%d]%.4lf,", ci + 1, exp(nll / (double)count));
                    fflush(p->log);
                }
                if (bar_on) qf_progress_update(&bar, ci + 1);
            }
        }
    }
    double secs = qf_now_sec() - t0;
    if (bar_on) qf_progress_end(&bar);
    if (p->log && rank == 0) fputc('\n', p->log);
    free(u.logits);
    free(u.chunk);
    free(rec);
    free(all);
    if (!st) st = qf_kld_commit(&kl, err);
    if (!st && rank == 0) st = qf_kld_finish(&kl, r, err);
    qf_kld_end(&kl);
    if (!agreed) st = qf_par_agree(st, err);
    if (st) return st;

    if (rank == 0) {
        r->n_chunks = n_chunk;
        r->n_scored = count;
        r->nll_mean = nll / (double)count;
        r->ppl = exp(r->nll_mean);
        double var = nll2 / (double)count - r->nll_mean * r->nll_mean;
        r->ppl_err = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) * r->ppl : 0;
        r->seconds = secs;
        r->tokens_per_sec = secs > 0 ? (double)n_chunk * n_ctx / secs : 0;
    }
    /* every rank returns rank 0's result */
    return qf_par_agree(qf_par_bcast(r, sizeof *r, 0, err), err);
}

/* A base file is only comparable with the run that asks for it: the same chunk size (p->n_ctx,
 * when > 0) and, when the caller has the text's tokens, the same tokens (the base stores the
 * n_chunk * n_ctx tokens it scored; the text must start with exactly those). QF_ERR_ARG otherwise. */
static qf_status kld_base_matches(const qf_kld_base_file *b, const qf_ppl_params *p, const int32_t *tokens,
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
    qf_kld_base_file base;
    qf_status st = qf_kld_base_open(&base, p->kl_base_read, err);
    if (st) return st;
    if ((st = kld_base_matches(&base, p, tokens, n_tokens, err))) {
        qf_kld_base_close(&base);
        return st;
    }
    qf_ppl_params q = *p;
    q.n_ctx = base.n_ctx;
    q.n_chunks = p->n_chunks > 0 && p->n_chunks < base.n_chunk ? p->n_chunks : base.n_chunk;
    st = perplexity(c, base.tokens, (int64_t)base.n_ctx * base.n_chunk, &q, &base, r, err);
    qf_kld_base_close(&base);
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

qf_status qf_ppl_read_text(const char *path, char **text, size_t *len, uint8_t *sha256, qf_error *err) {
    *text = NULL;
    *len = 0;
    qf_status st = qf_read_file(path, text, len, err);
    if (st) return st;
    if (*len > 0 && (*text)[*len - 1] == '\n') (*text)[--*len] = '\0';
    if (sha256) qf_sha256(*text, *len, sha256);
    return QF_OK;
}
