/* qforge/ppl.h: perplexity and KL-divergence, computed the way llama.cpp's
 * llama-perplexity does so the numbers can be compared side by side:
 * tokenize the whole text, split into chunks of n_ctx tokens, put BOS first in each chunk
 * when the vocabulary adds BOS, score only the second half of every chunk. */
#ifndef QFORGE_PPL_H
#define QFORGE_PPL_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qforge/error.h"
#include "qforge/model.h"

typedef struct {
    int n_ctx;          /* chunk length (tokens) */
    int n_chunks;       /* <= 0: all chunks the text holds */
    const char *kl_base_write; /* save reference log-probs here (llama.cpp --kl-divergence-base) */
    const char *kl_base_read;  /* compare against this file (llama.cpp --kl-divergence); it must have
                                * been made with this n_ctx (when > 0) and, when tokens are given,
                                * from these tokens: QF_ERR_ARG otherwise */
    bool kl_base_local; /* under mpirun (qforge/mpi.h): the base file is this rank's own and holds
                           only the chunks it runs; written and read by the same N ranks (the
                           forge's private reference files). Without it rank 0 writes one
                           llama.cpp file and every rank reads that one file. */
    FILE *log;          /* running values ("[1]12.34,[2]..."), NULL for silence */
    double *chunk_nll;  /* NULL, or receives each chunk's mean NLL in chunk order (rank 0; the
                           first chunk_nll_cap chunks) */
    int chunk_nll_cap;
    bool progress;      /* progress bar on a TTY */
} qf_ppl_params;

typedef struct {
    double ppl, ppl_err;   /* Final estimate: PPL = ppl +/- ppl_err */
    double nll_mean;
    int n_chunks;
    int64_t n_scored;
    int64_t n_tokens_text; /* tokens the whole text has */
    double seconds, tokens_per_sec; /* evaluated tokens (n_chunks * n_ctx) per second */
    bool has_kl;
    double kld_mean, kld_err, kld_median, kld_p99, kld_max;
    double same_top_p, same_top_p_err; /* fraction of positions whose argmax agrees */
    double rms_dp;       /* RMS of the probability difference of the actual next token */
    double ppl_base;     /* PPL of the base logits (when has_kl) */
    double delta_ppl, delta_ppl_err; /* has_kl: the paired ΔPPL against the base on the same tokens,
                                        and its per-chunk standard error (the spread of the per-chunk
                                        mean NLL differences / sqrt(chunks); 0 with one chunk). The
                                        base file floors log-probabilities 16 below the row's max
                                        logit (llama.cpp's format), so both sides are floored there:
                                        on text with many such tokens this differs from the ratio
                                        of the exact PPLs (qf_certify_* pairs exact NLLs) */
} qf_ppl_result;

QF_API qf_ppl_params qf_ppl_default_params(void);

/* Errors: QF_ERR_ARG when no token would be scored (n_ctx < 3, text too short); QF_ERR_FORMAT
 * when the model yields a non-finite log-likelihood (damaged weights): never a NaN result. */
/* Evaluate `tokens` (already tokenized, BOS handling done by the caller: pass the whole
 * file's tokens as llama.cpp does; the first token of each chunk is replaced by BOS when
 * the vocabulary adds BOS). */
QF_API qf_status qf_perplexity(qf_context *c, const int32_t *tokens, int64_t n_tokens,
                        const qf_ppl_params *p, qf_ppl_result *r, qf_error *err);

/* Tokenize a text file as llama-perplexity does (add BOS when the vocab adds it, no special
 * parsing) and evaluate it. */
QF_API qf_status qf_perplexity_text(qf_context *c, const char *text, size_t len, const qf_ppl_params *p,
                             qf_ppl_result *r, qf_error *err);

/* Read a text file the way llama-perplexity's -f does: the whole file, one trailing newline
 * dropped, so both tools see the same tokens. *text is malloc'd and NUL-terminated. sha256
 * (NULL, or 32 bytes) receives the SHA-256 of the bytes kept (what MPI ranks compare). */
QF_API qf_status qf_ppl_read_text(const char *path, char **text, size_t *len, uint8_t *sha256, qf_error *err);

#endif
