/* capture.c: the capture stage: KV and activation taps over our own engine's forward pass.
 *
 * The KV tap keeps a reservoir of whole tokens per layer (all kv heads of a token together,
 * so vector i still belongs to kv head i % n_kv_head): the first max_tokens tokens fill it,
 * token t > max_tokens replaces a random slot with probability max_tokens / t. The generator
 * is seeded and advanced once per token and layer, so the same tokens give the same sample on
 * every route (reference or fast), which is what the cross-check compares. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/capture.h"
#include "util/par.h"
#include "util/util.h"

struct qf_capture {
    qf_capture_params p;
    int n_layer, n_kv, hd;
    int64_t cap_tokens;             /* reservoir size in tokens */
    float **k, **v;                 /* [layer][cap_tokens * n_kv * hd] */
    int64_t *filled;                /* tokens in each layer's reservoir */
    int64_t *seen;                  /* tokens offered to each layer */
    uint64_t *rng;                  /* per-layer generator state */
    int64_t *n_vec;                 /* filled * n_kv, for the view */
    int64_t **slot_tok;             /* [layer][slot]: the stream index of the token kept there */
    qf_act_stats *act;              /* [layer][site] */
    int64_t tokens_seen;
    float *kpre;                    /* k_prerope: this batch's pre-RoPE K, taken by on_kv */
    size_t kpre_floats;
    bool kpre_oom;
    qf_tap tap;
};

/* k_prerope: keep the batch's K before RoPE; on_kv (same layer and batch) stores it. */
static void on_k_prerope(void *user, int layer, int pos0, int n_tok, int n_head_kv, int head_dim,
                         const float *k) {
    (void)layer, (void)pos0;
    qf_capture *cap = user;
    size_t n = (size_t)n_tok * n_head_kv * head_dim;
    if (n > cap->kpre_floats) {
        float *nb = realloc(cap->kpre, n * sizeof(float));
        if (!nb) {
            cap->kpre_oom = true;
            return;
        }
        cap->kpre = nb, cap->kpre_floats = n;
    }
    memcpy(cap->kpre, k, n * sizeof(float));
}

/* One token seen by `layer`'s reservoir: the slot it takes (recorded in slot_tok), or -1 when
 * it is not kept. The decision depends only on the count seen and the layer's generator, so
 * ranks that skip a window (skip_kv) replay exactly the decisions of the rank that ran it. */
static int64_t reservoir_slot(qf_capture *cap, int layer) {
    int64_t slot;
    int64_t seen = ++cap->seen[layer];
    if (cap->filled[layer] < cap->cap_tokens) slot = cap->filled[layer]++;
    else {
        uint64_t r = qf_xorshift64s(&cap->rng[layer]) % (uint64_t)seen;
        if (r >= (uint64_t)cap->cap_tokens) return -1;
        slot = (int64_t)r;
    }
    cap->slot_tok[layer][slot] = seen - 1;
    return slot;
}

static void on_kv(void *user, int layer, int pos0, int n_tok, int n_head_kv, int head_dim, const float *k,
                  const float *v) {
    (void)pos0;
    qf_capture *cap = user;
    if (!cap->k || layer >= cap->n_layer || n_head_kv != cap->n_kv || head_dim != cap->hd) return;
    if (cap->p.k_prerope) {
        if (cap->kpre_oom) return;
        k = cap->kpre;
    }
    size_t tok_floats = (size_t)n_head_kv * head_dim;
    for (int t = 0; t < n_tok; t++) {
        int64_t slot = reservoir_slot(cap, layer);
        if (slot < 0) continue;
        memcpy(cap->k[layer] + slot * tok_floats, k + t * tok_floats, tok_floats * sizeof(float));
        memcpy(cap->v[layer] + slot * tok_floats, v + t * tok_floats, tok_floats * sizeof(float));
    }
    cap->n_vec[layer] = cap->filled[layer] * cap->n_kv;
}

/* Under MPI, a window another rank runs: the same reservoir decisions as on_kv for its n
 * tokens (the generator does not depend on the data), recording which slots they take. */
static void skip_kv(qf_capture *cap, int n_tok) {
    for (int layer = 0; layer < cap->n_layer; layer++) {
        for (int t = 0; t < n_tok; t++) reservoir_slot(cap, layer);
        cap->n_vec[layer] = cap->filled[layer] * cap->n_kv;
    }
}

/* Under MPI: every slot's token was run by rank (token / n_ctx) % N; gather the kept K and V
 * rows so every rank holds the reservoir one process would have (in slot order). */
static qf_status merge_kv(qf_capture *cap, int n_ctx, qf_error *err) {
    const int N = qf_mpi_size(), R = qf_mpi_rank();
    const size_t tf = (size_t)cap->n_kv * cap->hd, row = 2 * tf * sizeof(float);
    size_t *counts = calloc((size_t)N, sizeof *counts), *at = calloc((size_t)N, sizeof *at);
    float *send = malloc((size_t)(cap->cap_tokens ? cap->cap_tokens : 1) * row);
    qf_status st = counts && at && send ? QF_OK : qf_fail(err, QF_ERR_NOMEM, "capture: out of memory for the merge");
    for (int l = 0; l < cap->n_layer && !st; l++) {
        size_t n = 0;
        for (int64_t s = 0; s < cap->filled[l]; s++)
            if ((cap->slot_tok[l][s] / n_ctx) % N == R) {
                memcpy(send + n * 2 * tf, cap->k[l] + s * tf, tf * sizeof(float));
                memcpy(send + n * 2 * tf + tf, cap->v[l] + s * tf, tf * sizeof(float));
                n++;
            }
        void *all = NULL;
        if ((st = qf_par_allgatherv(send, n * row, &all, counts, err))) break;
        at[0] = 0;
        for (int r = 1; r < N; r++) at[r] = at[r - 1] + counts[r - 1];
        for (int64_t s = 0; s < cap->filled[l]; s++) {
            int o = (int)((cap->slot_tok[l][s] / n_ctx) % N);
            const float *src = (const float *)(const void *)((const uint8_t *)all + at[o]);
            memcpy(cap->k[l] + s * tf, src, tf * sizeof(float));
            memcpy(cap->v[l] + s * tf, src + tf, tf * sizeof(float));
            at[o] += row;
        }
        free(all);
    }
    free(counts), free(at), free(send);
    return st;
}

static void on_act(void *user, int layer, qf_act_site site, int n_tok, int dim, const float *x) {
    qf_capture *cap = user;
    if (!cap->act || layer >= cap->n_layer) return;
    qf_act_stats *s = &cap->act[layer * QF_ACT_SITE_COUNT + site];
    if (s->dim != dim) return;
    for (int t = 0; t < n_tok; t++) {
        const float *r = x + (size_t)t * dim;
        for (int i = 0; i < dim; i++) {
            float a = fabsf(r[i]);
            s->sum_abs[i] += a;
            s->sum_sq[i] += (double)r[i] * r[i];
            if (a > s->max_abs[i]) s->max_abs[i] = a;
        }
    }
    s->count += n_tok;
}

void qf_capture_free(qf_capture *cap) {
    if (!cap) return;
    for (int l = 0; l < cap->n_layer; l++) {
        if (cap->k) free(cap->k[l]);
        if (cap->v) free(cap->v[l]);
        if (cap->slot_tok) free(cap->slot_tok[l]);
        if (cap->act)
            for (int s = 0; s < QF_ACT_SITE_COUNT; s++) {
                qf_act_stats *a = &cap->act[l * QF_ACT_SITE_COUNT + s];
                free(a->sum_abs), free(a->sum_sq), free(a->max_abs);
            }
    }
    free(cap->k), free(cap->v), free(cap->slot_tok), free(cap->filled), free(cap->seen), free(cap->rng), free(cap->n_vec);
    free(cap->act);
    free(cap->kpre);
    free(cap);
}

qf_capture *qf_capture_new(const qf_hparams *hp, const qf_capture_params *p, qf_error *err) {
    qf_capture *cap = calloc(1, sizeof *cap);
    if (!cap) goto oom;
    cap->p = *p;
    cap->n_layer = hp->n_layer, cap->n_kv = hp->n_head_kv, cap->hd = hp->head_dim;
    cap->filled = calloc((size_t)hp->n_layer, sizeof(int64_t));
    cap->seen = calloc((size_t)hp->n_layer, sizeof(int64_t));
    cap->n_vec = calloc((size_t)hp->n_layer, sizeof(int64_t));
    cap->rng = calloc((size_t)hp->n_layer, sizeof(uint64_t));
    if (!cap->filled || !cap->seen || !cap->n_vec || !cap->rng) goto oom;
    if (p->max_per_layer < 0 || p->max_per_layer > ((int64_t)1 << 32)) {
        qf_capture_free(cap);
        qf_fail(err, QF_ERR_ARG, "capture: max_per_layer %lld is out of range", (long long)p->max_per_layer);
        return NULL;
    }
    cap->cap_tokens = p->max_per_layer / hp->n_head_kv;
    if (p->max_per_layer > 0 && cap->cap_tokens == 0) cap->cap_tokens = 1;
    if (cap->cap_tokens > 0) {
        cap->k = calloc((size_t)hp->n_layer, sizeof(float *));
        cap->v = calloc((size_t)hp->n_layer, sizeof(float *));
        cap->slot_tok = calloc((size_t)hp->n_layer, sizeof(int64_t *));
        if (!cap->k || !cap->v || !cap->slot_tok) goto oom;
        size_t n = (size_t)cap->cap_tokens * hp->n_head_kv * hp->head_dim;
        for (int l = 0; l < hp->n_layer; l++)
            if (!(cap->k[l] = malloc(n * sizeof(float))) || !(cap->v[l] = malloc(n * sizeof(float))) ||
                !(cap->slot_tok[l] = malloc((size_t)cap->cap_tokens * sizeof(int64_t))))
                goto oom;
    }
    if (p->activations) {
        cap->act = calloc((size_t)hp->n_layer * QF_ACT_SITE_COUNT, sizeof(qf_act_stats));
        if (!cap->act) goto oom;
        int dims[QF_ACT_SITE_COUNT] = {hp->n_embd, hp->n_head * hp->head_dim, hp->n_embd, hp->n_ff};
        for (int l = 0; l < hp->n_layer; l++)
            for (int s = 0; s < QF_ACT_SITE_COUNT; s++) {
                qf_act_stats *a = &cap->act[l * QF_ACT_SITE_COUNT + s];
                a->dim = dims[s];
                a->sum_abs = calloc((size_t)dims[s], sizeof(double));
                a->sum_sq = calloc((size_t)dims[s], sizeof(double));
                a->max_abs = calloc((size_t)dims[s], sizeof(float));
                if (!a->sum_abs || !a->sum_sq || !a->max_abs) goto oom;
            }
    }
    cap->tap.user = cap;
    cap->tap.on_kv = cap->k ? on_kv : NULL;
    cap->tap.on_act = cap->act ? on_act : NULL;
    cap->tap.on_k_prerope = cap->k && p->k_prerope ? on_k_prerope : NULL;
    qf_capture_clear(cap);
    return cap;
oom:
    qf_capture_free(cap);
    qf_fail(err, QF_ERR_NOMEM, "capture: out of memory (max_per_layer %lld)", (long long)p->max_per_layer);
    return NULL;
}

const qf_tap *qf_capture_tap(qf_capture *cap) { return &cap->tap; }

void qf_capture_clear(qf_capture *cap) {
    for (int l = 0; l < cap->n_layer; l++) {
        cap->filled[l] = cap->seen[l] = cap->n_vec[l] = 0;
        cap->rng[l] = (cap->p.seed ? cap->p.seed : 0x9E3779B97F4A7C15ull) + 0x632BE59BD9B4E019ull * (uint64_t)(l + 1);
        if (cap->act)
            for (int s = 0; s < QF_ACT_SITE_COUNT; s++) {
                qf_act_stats *a = &cap->act[l * QF_ACT_SITE_COUNT + s];
                a->count = 0;
                memset(a->sum_abs, 0, (size_t)a->dim * sizeof(double));
                memset(a->sum_sq, 0, (size_t)a->dim * sizeof(double));
                memset(a->max_abs, 0, (size_t)a->dim * sizeof(float));
            }
    }
    cap->tokens_seen = 0;
}

qf_status qf_capture_run(qf_context *c, qf_capture *cap, const int32_t *tokens, int64_t n_tokens, int n_ctx,
                         int64_t max_tokens, bool progress, qf_error *err) {
    const qf_model *m = qf_context_model(c);
    const qf_tokenizer *tok = qf_model_tokenizer(m);
    const qf_context_params *cp = qf_context_params_get(c);
    if (n_ctx <= 0 || n_ctx > cp->n_ctx) n_ctx = cp->n_ctx;
    if (max_tokens > 0 && max_tokens < n_tokens) n_tokens = max_tokens;
    if (n_tokens <= 0) return qf_fail(err, QF_ERR_CAPTURE_FAILED, "capture: no tokens to run");
    /* under mpirun window w runs on rank w % N (KV taps only: activation sums are not split) */
    const int N = qf_mpi_size(), R = qf_mpi_rank();
    const bool shard = N > 1 && !cap->act;
    bool add_bos = qf_tokenizer_add_bos(tok) && qf_tokenizer_bos(tok) >= 0;
    int32_t *win = malloc((size_t)n_ctx * sizeof(int32_t));
    qf_status st = win ? QF_OK : qf_fail(err, QF_ERR_NOMEM, "capture: out of memory");
    qf_context_set_tap(c, qf_capture_tap(cap));
    qf_progress bar;
    progress = progress && R == 0;
    if (progress) qf_progress_begin(&bar, "capture", n_tokens);
    for (int64_t start = 0, w = 0; start < n_tokens && !st; start += n_ctx, w++) {
        int n = (int)(n_tokens - start < n_ctx ? n_tokens - start : n_ctx);
        if (shard && w % N != R) {
            if (cap->k) skip_kv(cap, n);
        } else if (!(st = qf_par_injected("capture window", err))) {
            memcpy(win, tokens + start, (size_t)n * sizeof(int32_t));
            if (add_bos) win[0] = qf_tokenizer_bos(tok);
            for (int j = 0; j < n && !st; j += cp->n_batch) {
                int bs = n - j < cp->n_batch ? n - j : cp->n_batch;
                st = qf_decode(c, win + j, bs, j, NULL, bs, err);
            }
        }
        cap->tokens_seen += n;
        if (progress) qf_progress_update(&bar, start + n);
    }
    if (progress) qf_progress_end(&bar);
    qf_context_set_tap(c, NULL);
    free(win);
    if (!st && cap->kpre_oom) st = qf_fail(err, QF_ERR_NOMEM, "out of memory for the pre-RoPE keys");
    if (shard) {
        if ((st = qf_par_agree(st, err))) {
            if (err) err->code = QF_ERR_CAPTURE_FAILED;
            return QF_ERR_CAPTURE_FAILED;
        }
        if (cap->k && (st = qf_par_agree(merge_kv(cap, n_ctx, err), err))) return st;
    }
    if (st) return qf_error_prefix(err, "capture: "), QF_ERR_CAPTURE_FAILED;
    return QF_OK;
}

qf_kv_capture_view qf_capture_kv_view(const qf_capture *cap) {
    qf_kv_capture_view v = {
        .n_layer = cap->n_layer,
        .n_kv_head = cap->n_kv,
        .head_dim = cap->hd,
        .k = (const float *const *)cap->k,
        .v = (const float *const *)cap->v,
        .n_k = cap->n_vec,
        .n_v = cap->n_vec,
    };
    return v;
}

int64_t qf_capture_tokens_seen(const qf_capture *cap) { return cap->tokens_seen; }

const qf_act_stats *qf_capture_act(const qf_capture *cap, int layer, qf_act_site site) {
    if (!cap->act || layer < 0 || layer >= cap->n_layer || (unsigned)site >= QF_ACT_SITE_COUNT) return NULL;
    return &cap->act[layer * QF_ACT_SITE_COUNT + site];
}

double qf_capture_max_rel_diff(const qf_capture *a, const qf_capture *b) {
    double worst = 0;
    if (!a->k || !b->k || a->n_layer != b->n_layer) return INFINITY;
    for (int l = 0; l < a->n_layer; l++) {
        if (a->filled[l] != b->filled[l]) return INFINITY;
        size_t n = (size_t)a->filled[l] * a->n_kv * a->hd;
        for (int s = 0; s < 2; s++) {
            const float *x = s ? a->v[l] : a->k[l], *y = s ? b->v[l] : b->k[l];
            double num = 0, den = 0;
            for (size_t i = 0; i < n; i++) {
                double d = (double)x[i] - y[i];
                num += d * d;
                den += (double)x[i] * x[i];
            }
            double r = den > 0 ? sqrt(num / den) : sqrt(num);
            if (r > worst) worst = r;
        }
    }
    return worst;
}
