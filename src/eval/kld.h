/* kld.h: KL divergence of a candidate run against a base run, for the perplexity oracle
 * (eval/ppl.c). The base file is llama-perplexity's --kl-divergence-base format, so a base file
 * written by either tool can be read by the other:
 *
 *   "_logits_"  (8 bytes)
 *   int32 n_ctx, int32 n_vocab, int32 n_chunk          (little endian)
 *   int32 tokens[n_chunk * n_ctx]                       (the text's tokens, BOS not substituted)
 *   per chunk, per scored position (n_ctx - 1 - n_ctx/2 of them), nv = 2*((n_vocab+1)/2) + 4
 *   uint16 words: float scale, float min_log_prob, then n_vocab quantized log-probs
 *   q_i = round((logit_i - min_logit) / scale), min_logit = max(min logit, max logit - 16),
 *   scale = (max_logit - min_logit) / 65535; log p_i = scale * q_i + min_log_prob.
 *
 * The statistics follow llama.cpp: KLD(base || candidate) summed over the base's tokens with
 * log p_base > -16, same-top-1 rate, and the RMS of p(next token) differences. */
#ifndef QF_EVAL_KLD_H
#define QF_EVAL_KLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/ppl.h"
#include "util/util.h"

/* header of a base file: n_ctx, n_vocab, n_chunk and a pointer to its tokens */
typedef struct {
    qf_mapped_file mf;
    int n_ctx, n_vocab, n_chunk;
    const int32_t *tokens;
    const uint8_t *rows;
    size_t rows_len;
} qf_kld_base_file;

/* What one scored position contributes to the KL statistics: computed on the rank that ran
 * the chunk, accumulated on rank 0 in chunk order (qf_kld_accumulate), so the sums are the same
 * additions in the same order for any number of ranks. */
typedef struct {
    float nll, nll_base, pd;
    float nll_floor; /* the largest NLL the base row can store (its logits are clamped 16 below
                        the max, llama.cpp's format): a base NLL at this value may be larger */
    int32_t same_top;
    double kl;
} qf_kld_pos;

/* The KL bookkeeping of one perplexity run: reading a base file (compare), writing one (save),
 * or neither. Fields are read by ppl.c (reading, local, nv); the rest is private to kld.c. */
typedef struct {
    bool reading, writing; /* this rank compares against base rows / encodes rows to save */
    bool local;           /* MPI: the base file is this rank's own and holds only its chunks */
    bool file_open;       /* this rank writes the base file (rank 0, or every rank when local) */
    qf_atomic_file out;
    int n_ctx, n_vocab, n_chunk, n_score, nv;
    uint16_t *rows;   /* one chunk of rows (local writing) */
    const uint8_t *in_rows; /* reading: the mapped file's rows */
    size_t in_rows_len;
    double sum_nll, sum_nll2, sum_nll_base, sum_nll_base2, sum_kld, sum_kld2, sum_p_diff2, sum_p_diff4;
    double sum_dchunk, sum_dchunk2; /* per chunk: mean(nll - nll_base) over its positions, and its square */
    int n_dchunk;
    size_t n_same_top, count;
    float *kld_values;
} qf_kld_state;

/* Map the base file at `path` and check its header against its size and its tokens against its
 * vocabulary (QF_ERR_FORMAT when it is not a base file, is truncated or holds bad ids). Release with qf_kld_base_close. */
qf_status qf_kld_base_open(qf_kld_base_file *b, const char *path, qf_error *err);
/* The parse qf_kld_base_open does, over bytes in memory (`path` names them in messages): the
 * header must fit the size, and every stored token must be an id of its own vocabulary (they
 * are fed to the model). Fills b's fields except mf. QF_ERR_FORMAT otherwise. (fuzz_klbase) */
qf_status qf_kld_base_parse(qf_kld_base_file *b, const uint8_t *data, size_t size, const char *path, qf_error *err);
void qf_kld_base_close(qf_kld_base_file *b);

/* Start a run over n_chunk chunks of n_ctx tokens (n_own of them run on this rank: its rows in a
 * rank-local base file). base: the opened base file to compare against, or NULL; when NULL and
 * p->kl_base_write is set, the base file is written (header and `tokens` now, rows per chunk,
 * atomically: nothing appears at the path unless qf_kld_commit succeeds). On failure the state
 * still needs qf_kld_end. */
qf_status qf_kld_begin(qf_kld_state *k, const qf_ppl_params *p, int n_ctx, int n_vocab, int n_chunk, int n_own,
                       const qf_kld_base_file *base, const int32_t *tokens, qf_error *err);

/* (qf_kld_accumulate is called once per chunk, with that chunk's n scored positions: the
 * paired per-chunk ΔPPL statistics count calls as chunks.) */
/* The rank that ran a chunk, with the logits of its n scored positions and their next tokens:
 * writing: encode the rows into rows_out (n * nv words; NULL when local: they go to this rank's
 * own file at once); reading: compare them with base row block `row_block` into pos[0..n). The
 * rows are split over `pool` (NULL: the calling thread alone); every row is computed by one
 * thread, so rows_out and pos are the same bytes for any number of threads. A damaged base row
 * (non-finite scale or offset): QF_ERR_FORMAT naming the first one. */
qf_status qf_kld_chunk(qf_kld_state *k, const float *logits, const int32_t *next, int n, int row_block,
                       uint16_t *rows_out, qf_kld_pos *pos, qf_pool *pool, qf_error *err);

/* Rank 0, in chunk order: add one chunk's n positions to the sums (the single-process order,
 * so the statistics are bit-identical for any number of ranks). */
void qf_kld_accumulate(qf_kld_state *k, const qf_kld_pos *pos, int n);

/* Rank 0: append n gathered rows to the base file (a no-op when this rank writes none). */
qf_status qf_kld_write_rows(qf_kld_state *k, const uint16_t *rows, int n, qf_error *err);

/* Commit the base file (every rank that writes one); a no-op otherwise. */
qf_status qf_kld_commit(qf_kld_state *k, qf_error *err);

/* Rank 0: fill r's KL fields (has_kl, kld_mean/err/median/p99/max, ppl_base, rms_dp,
 * same_top_p/err) from the accumulated sums; leaves r alone when nothing was compared. */
qf_status qf_kld_finish(qf_kld_state *k, qf_ppl_result *r, qf_error *err);

/* Release the state; an uncommitted base file is removed (its path untouched). */
void qf_kld_end(qf_kld_state *k);

#endif
