/* kld.c: KL divergence against a llama-perplexity base file (format and contracts in kld.h). */
#include "eval/kld.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vecmath.h"
#include "qforge/mpi.h"

static int nearest_int_f(float f) {
    return (int)lrintf(f);
}

/* Parse a base file held in memory (data, size; `path` names it in messages): the header must
 * fit the size, and every stored token must be a valid id of its own vocabulary (they are fed
 * to the model). Fills b's fields except mf. QF_ERR_FORMAT otherwise. */
qf_status qf_kld_base_parse(qf_kld_base_file *b, const uint8_t *data, size_t size, const char *path, qf_error *err) {
    if (size < 20 || memcmp(data, "_logits_", 8) != 0)
        return qf_fail(err, QF_ERR_FORMAT, "%s: does not look like a file of log-probabilities (no _logits_ header)", path);
    int32_t h[3];
    memcpy(h, data + 8, 12);
    b->n_ctx = h[0], b->n_vocab = h[1], b->n_chunk = h[2];
    uint64_t ntok = (uint64_t)(uint32_t)b->n_ctx * (uint32_t)b->n_chunk;
    if (b->n_ctx < 2 || b->n_vocab < 1 || b->n_chunk < 1 || b->n_ctx > (1 << 24) || b->n_chunk > (1 << 24) ||
        20 + ntok * 4 > size)
        return qf_fail(err, QF_ERR_FORMAT, "%s: header n_ctx %d, n_vocab %d, n_chunk %d does not fit the file size %zu",
                       path, h[0], h[1], h[2], size);
    /* the mapping is page-aligned and the tokens start at byte 20: int32-aligned */
    b->tokens = (const int32_t *)(const void *)(data + 20);
    for (uint64_t i = 0; i < ntok; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= b->n_vocab)
            return qf_fail(err, QF_ERR_FORMAT, "%s: token %llu is %d, outside the vocabulary of %d", path,
                           (unsigned long long)i, b->tokens[i], b->n_vocab);
    b->rows = data + 20 + ntok * 4;
    b->rows_len = size - 20 - ntok * 4;
    return QF_OK;
}

qf_status qf_kld_base_open(qf_kld_base_file *b, const char *path, qf_error *err) {
    memset(b, 0, sizeof *b);
    qf_status st = qf_map_file(path, &b->mf, err);
    if (st) return st;
    if ((st = qf_kld_base_parse(b, b->mf.data, b->mf.size, path, err))) qf_unmap_file(&b->mf);
    return st;
}

/* n_own: the chunks this rank runs (its rows in a local base file). */
qf_status qf_kld_begin(qf_kld_state *k, const qf_ppl_params *p, int n_ctx, int n_vocab, int n_chunk, int n_own,
                       const qf_kld_base_file *base, const int32_t *tokens, qf_error *err) {
    memset(k, 0, sizeof *k);
    k->n_ctx = n_ctx, k->n_vocab = n_vocab, k->n_chunk = n_chunk;
    k->n_score = n_ctx - 1 - n_ctx / 2;
    k->nv = 2 * ((n_vocab + 1) / 2) + 4;
    k->local = p->kl_base_local && qf_mpi_size() > 1;
    if (base) {
        k->reading = true;
        if (base->n_vocab != n_vocab)
            return qf_fail(err, QF_ERR_ARG, "%s: log-probs were computed with a vocabulary of %d tokens, this model has %d",
                           p->kl_base_read, base->n_vocab, n_vocab);
        size_t need = (size_t)(k->local ? n_own : base->n_chunk) * k->n_score * k->nv * 2;
        if (base->rows_len < need)
            return qf_fail(err, QF_ERR_FORMAT, "%s: truncated: %zu bytes of log-probs, %zu expected", p->kl_base_read,
                           base->rows_len, need);
        k->in_rows = base->rows;
        k->in_rows_len = base->rows_len;
        k->kld_values = malloc((size_t)n_chunk * k->n_score * sizeof(float));
        if (!k->kld_values) return qf_fail(err, QF_ERR_NOMEM, "out of memory");
    } else if (p->kl_base_write) {
        k->writing = true;
        k->rows = malloc((size_t)k->n_score * k->nv * sizeof(uint16_t));
        if (!k->rows) return qf_fail(err, QF_ERR_NOMEM, "out of memory");
        if (!k->local && qf_mpi_rank() != 0) return QF_OK; /* rank 0 writes the rows it gathers */
        qf_status st = qf_atomic_open(&k->out, p->kl_base_write, err);
        if (st) return st;
        k->file_open = true;
        int32_t h[3] = {n_ctx, n_vocab, n_chunk};
        if ((st = qf_atomic_write(&k->out, "_logits_", 8, err)) || (st = qf_atomic_write(&k->out, h, 12, err)) ||
            (st = qf_atomic_write(&k->out, tokens, (size_t)n_chunk * n_ctx * 4, err))) {
            k->file_open = false; /* qf_atomic_write aborted the temp file */
            return st;
        }
    }
    return QF_OK;
}

/* one scored position: write its quantized log-probs (llama.cpp's layout) */
static void kld_encode_row(const float *logits, int n_vocab, uint16_t *row) {
    float mx = logits[0], mn = logits[0];
    for (int i = 1; i < n_vocab; i++) {
        mx = logits[i] > mx ? logits[i] : mx;
        mn = logits[i] < mn ? logits[i] : mn;
    }
    if (mn < mx - 16) mn = mx - 16;
    float lse = (float)log(qf_vec_sum_exp_ref(logits, n_vocab, mx)); /* expf summed in order, in double */
    float d[2] = {(mx - mn) / 65535.f, mn - mx - lse};
    memcpy(row, d, 8);
    uint16_t *q = row + 4;
    if (d[0] != 0) {
        float inv = 1 / d[0];
        for (int i = 0; i < n_vocab; i++) q[i] = logits[i] > mn ? (uint16_t)nearest_int_f(inv * (logits[i] - mn)) : 0;
    } else {
        memset(q, 0, (size_t)n_vocab * sizeof(uint16_t));
    }
}

/* one scored position against the base row: llama.cpp's per-position statistics */
static void kld_compare_row(const qf_kld_state *k, const float *logits, const uint16_t *row, int tok, qf_kld_pos *o) {
    int n_vocab = k->n_vocab, imax = 0;
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i], imax = i;
    float lse = (float)log(qf_vec_sum_exp_ref(logits, n_vocab, mx));
    float d[2];
    memcpy(d, row, 8);
    const uint16_t *q = row + 4;
    float nll = mx + lse - logits[tok];
    float nll_base = -(d[0] * q[tok] + d[1]);
    float lz = mx + lse;
    double kl = 0;
    int imax_base = 0;
    float best = 0;
    for (int i = 0; i < n_vocab; i++) {
        float lpb = d[0] * q[i] + d[1];
        if (i == 0 || lpb > best) best = lpb, imax_base = i;
        if (lpb > -16.f) kl += expf(lpb) * (lpb - logits[i] + lz);
    }
    o->nll = nll;
    o->nll_base = nll_base;
    o->nll_floor = -d[1]; /* code 0 */
    o->kl = kl;
    o->same_top = imax == imax_base;
    o->pd = expf(-nll) - expf(-nll_base);
}

/* rank 0, in chunk order: add one chunk's positions to the sums (the single-process order) */
void qf_kld_accumulate(qf_kld_state *k, const qf_kld_pos *pos, int n) {
    QF_ASSERT(k->count + (size_t)n <= (size_t)k->n_chunk * k->n_score); /* kld_values' capacity */
    /* this chunk's paired log-likelihood difference; where the base row floors the token's
     * log-probability the candidate's NLL is floored the same way, so a clamped base does not
     * read as a candidate loss (the base file keeps logits down to max - 16 only) */
    double dsum = 0;
    for (int i = 0; i < n; i++) {
        double nc = pos[i].nll < pos[i].nll_floor ? pos[i].nll : pos[i].nll_floor;
        dsum += nc - (double)pos[i].nll_base;
    }
    if (n > 0) {
        double d = dsum / n;
        k->sum_dchunk += d, k->sum_dchunk2 += d * d, k->n_dchunk++;
    }
    for (int i = 0; i < n; i++) {
        const qf_kld_pos *o = &pos[i];
        float nll = o->nll, nll_base = o->nll_base;
        double kl = o->kl;
        k->sum_nll += nll, k->sum_nll2 += (double)nll * nll;
        k->sum_nll_base += nll_base, k->sum_nll_base2 += (double)nll_base * nll_base;
        k->sum_kld += kl, k->sum_kld2 += kl * kl;
        k->kld_values[k->count] = (float)kl;
        k->n_same_top += o->same_top != 0;
        double pd2 = (double)o->pd * o->pd;
        k->sum_p_diff2 += pd2, k->sum_p_diff4 += pd2 * pd2;
        k->count++;
    }
}

/* the rows of one chunk over the pool's threads: each row's encoding or comparison is computed
 * by one thread exactly as alone, so the results do not depend on the number of threads */
typedef struct {
    const qf_kld_state *k;
    const float *logits;
    const int32_t *next;
    int n;
    const uint8_t *base; /* reading: the row block */
    uint16_t *dst;       /* writing */
    qf_kld_pos *pos;
    uint8_t *bad; /* reading: [n] 1 where the row's scale/offset is not finite, 2 where its thread
                     had no memory for its row buffer */
} kld_rows_job;

static void kld_rows_worker(void *arg, int ith, int nth) {
    kld_rows_job *j = arg;
    const qf_kld_state *k = j->k;
    int64_t r0, r1;
    qf_split_range(j->n, ith, nth, &r0, &r1);
    if (r0 >= r1) return;
    if (!j->base) {
        for (int64_t i = r0; i < r1; i++)
            kld_encode_row(j->logits + (size_t)i * k->n_vocab, k->n_vocab, j->dst + (size_t)i * k->nv);
        return;
    }
    uint16_t *row = malloc((size_t)k->nv * 2); /* rows are not 4-byte aligned in general */
    if (!row) {
        memset(j->bad + r0, 2, (size_t)(r1 - r0));
        return;
    }
    for (int64_t i = r0; i < r1; i++) {
        memcpy(row, j->base + (size_t)i * k->nv * 2, (size_t)k->nv * 2);
        float d[2];
        memcpy(d, row, 8);
        j->bad[i] = !isfinite(d[0]) || !isfinite(d[1]);
        if (!j->bad[i]) kld_compare_row(k, j->logits + (size_t)i * k->n_vocab, row, j->next[i], &j->pos[i]);
    }
    free(row);
}

/* The rank that ran a chunk: encode its rows into `rows_out` (writing; NULL when local: they
 * go to this rank's own file at once) or compare them with base row block `row_block` into
 * `pos` (reading); the rows over `pool` (NULL: the caller alone). */
qf_status qf_kld_chunk(qf_kld_state *k, const float *logits, const int32_t *next, int n, int row_block,
                       uint16_t *rows_out, qf_kld_pos *pos, qf_pool *pool, qf_error *err) {
    if (k->writing) {
        uint16_t *dst = rows_out ? rows_out : k->rows;
        kld_rows_job j = {.k = k, .logits = logits, .n = n, .dst = dst};
        qf_pool_run(pool, kld_rows_worker, &j);
        if (rows_out) return QF_OK;
        qf_status st = qf_atomic_write(&k->out, k->rows, (size_t)n * k->nv * sizeof(uint16_t), err);
        if (st) k->file_open = false; /* qf_atomic_write aborted the temp file */
        return st;
    }
    if (k->reading) {
        /* qf_kld_begin checked the file holds every row block this run reads */
        QF_ASSERT(((size_t)row_block + 1) * n * k->nv * 2 <= k->in_rows_len);
        uint8_t *bad = calloc((size_t)(n > 0 ? n : 1), 1);
        if (!bad) return qf_fail(err, QF_ERR_NOMEM, "out of memory");
        kld_rows_job j = {.k = k, .logits = logits, .next = next, .n = n,
                          .base = k->in_rows + (size_t)row_block * n * k->nv * 2, .pos = pos, .bad = bad};
        qf_pool_run(pool, kld_rows_worker, &j);
        qf_status st = QF_OK;
        for (int i = 0; i < n && !st; i++) /* the first failing row, as the serial loop found it */
            if (bad[i] == 2) st = qf_fail(err, QF_ERR_NOMEM, "out of memory");
            else if (bad[i])
                st = qf_fail(err, QF_ERR_FORMAT, "KL base: row %d of block %d: non-finite scale/offset (damaged file)",
                             i, row_block);
        free(bad);
        return st;
    }
    return QF_OK;
}

/* rank 0: append gathered rows to the base file */
qf_status qf_kld_write_rows(qf_kld_state *k, const uint16_t *rows, int n, qf_error *err) {
    if (!k->file_open) return QF_OK;
    qf_status st = qf_atomic_write(&k->out, rows, (size_t)n * k->nv * sizeof(uint16_t), err);
    if (st) k->file_open = false;
    return st;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void mean_unc(double sum, double sum2, size_t n, double *mean, double *unc) {
    *mean = n ? sum / (double)n : 0;
    double v = n ? sum2 / (double)n - *mean * *mean : 0;
    *unc = v > 0 && n > 10 ? sqrt(v / (double)(n - 1)) : 0;
}

/* commit the base file (every rank that writes one) */
qf_status qf_kld_commit(qf_kld_state *k, qf_error *err) {
    if (!k->file_open) return QF_OK;
    k->file_open = false;
    return qf_atomic_commit(&k->out, err);
}

/* rank 0: the statistics from the accumulated sums */
qf_status qf_kld_finish(qf_kld_state *k, qf_ppl_result *r, qf_error *err) {
    (void)err;
    if (!k->reading || k->count == 0) return QF_OK;
    double m, u;
    r->has_kl = true;
    mean_unc(k->sum_kld, k->sum_kld2, k->count, &r->kld_mean, &r->kld_err);
    mean_unc(k->sum_nll_base, k->sum_nll_base2, k->count, &m, &u);
    r->ppl_base = exp(m);
    mean_unc(k->sum_p_diff2, k->sum_p_diff4, k->count, &m, &u);
    r->rms_dp = sqrt(m);
    /* ΔPPL = exp(mean over chunks of the paired per-chunk mean NLL difference) - 1 (every chunk
     * scores the same number of positions), NLLs floored where the base floors them (above);
     * its standard error from the spread of those per-chunk differences (chunks are the
     * independent units: positions within one chunk share their context), by the delta method;
     * 0 with fewer than 2 chunks */
    if (k->n_dchunk > 0) {
        int nc = k->n_dchunk;
        double md = k->sum_dchunk / nc, var = nc > 1 ? (k->sum_dchunk2 - nc * md * md) / (nc - 1) : 0;
        r->delta_ppl = expm1(md);
        r->delta_ppl_err = var > 0 ? exp(md) * sqrt(var / nc) : 0;
    }
    r->same_top_p = (double)k->n_same_top / (double)k->count;
    r->same_top_p_err = k->count > 1 ? sqrt(r->same_top_p * (1 - r->same_top_p) / (double)(k->count - 1)) : 0;
    qsort(k->kld_values, k->count, sizeof(float), cmp_float);
    size_t n = k->count;
    r->kld_median = n % 2 ? k->kld_values[n / 2] : 0.5f * (k->kld_values[n / 2] + k->kld_values[n / 2 - 1]);
    double pos = 0.99 * (double)(n - 1);
    size_t ip = (size_t)pos;
    double frac = pos - (double)ip;
    r->kld_p99 = (1 - frac) * k->kld_values[ip] + frac * k->kld_values[ip + 1 < n ? ip + 1 : n - 1];
    r->kld_max = k->kld_values[n - 1];
    return QF_OK;
}

void qf_kld_base_close(qf_kld_base_file *b) { qf_unmap_file(&b->mf); }

void qf_kld_end(qf_kld_state *k) {
    if (k->file_open) qf_atomic_abort(&k->out);
    free(k->rows);
    free(k->kld_values);
}
