/* sample.c: next-token sampling. Greedy at temp <= 0; otherwise softmax(logits / temp), keep the
 * top-k most likely tokens, then the smallest prefix whose mass reaches top-p, and draw from
 * what is left with a seeded xorshift64* generator.
 *
 * The order of the candidates is (probability descending, token id ascending), a total order,
 * so the first k of it are the same whether the whole vocabulary is sorted (qf_sample_ref, the
 * oracle) or only its k best are selected (qf_sample: a heap over the candidate array, then a
 * sort of those k). At a 128k vocabulary the full sort took 32 ms a token, 20x the 8B model's
 * GPU decode step (docs/gpu.md, "Sampling"). */
#include <math.h>
#include <stdlib.h>

#include "engine/sample.h"
#include "util/util.h"

typedef struct qf_prob_idx cand_t;

int qf_sampler_init(qf_sampler *s, const qf_sampler_params *p, int n_vocab) {
    s->p = *p;
    s->state = p->seed ? p->seed : 0x9E3779B97F4A7C15ull;
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    return s->cand ? 0 : -1;
}

void qf_sampler_free(qf_sampler *s) {
    free(s->cand);
    s->cand = NULL;
}

static double next_uniform(qf_sampler *s) {
    return (double)(qf_xorshift64s(&s->state) >> 11) * (1.0 / 9007199254740992.0);
}

static int by_prob_desc(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

/* the first index of the largest logit (the oracle's loop: a NaN never compares larger) */
static int32_t argmax(const float *logits, int n) {
    int32_t best = 0;
    float bv = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > bv) bv = logits[i], best = i;
    return best;
}

/* a ranks before b in by_prob_desc's order */
static inline int before(const cand_t *a, const cand_t *b) { return a->p > b->p || (a->p == b->p && a->id < b->id); }

/* h[0..m) as a heap whose root is the last of them in by_prob_desc's order: sift h[i] down */
static void sift_down(cand_t *h, int m, int i) {
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        if (l < m && before(&h[w], &h[l])) w = l;
        if (r < m && before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand_t t = h[i];
        h[i] = h[w], h[w] = t, i = w;
    }
}

/* The first m of c[0..n) in by_prob_desc's order, moved to c[0..m) and sorted; the others stay
 * in c[m..n) in some order. O(n log m). */
static void select_sorted(cand_t *c, int n, int m) {
    if (m >= n) {
        qsort(c, (size_t)n, sizeof *c, by_prob_desc);
        return;
    }
    for (int i = m / 2 - 1; i >= 0; i--) sift_down(c, m, i);
    for (int i = m; i < n; i++)
        if (before(&c[i], &c[0])) {
            cand_t t = c[0];
            c[0] = c[i], c[i] = t;
            sift_down(c, m, 0);
        }
    qsort(c, (size_t)m, sizeof *c, by_prob_desc);
}

/* the candidates kept by top-p among the first keep of the sorted c: keep itself when their
 * mass stays below top_p, else the shortest prefix that reaches it; *reached (if given) says
 * which */
static int top_p_cut(const cand_t *c, int keep, float top_p, int *reached) {
    double cum = 0;
    for (int i = 0; i < keep; i++) {
        cum += c[i].p;
        if (cum >= top_p) {
            if (reached) *reached = 1;
            return i + 1;
        }
    }
    if (reached) *reached = 0;
    return keep;
}

/* the draw among the first keep of the sorted c (the generator advances once) */
static int32_t draw(qf_sampler *s, const cand_t *c, int keep) {
    double mass = 0;
    for (int i = 0; i < keep; i++) mass += c[i].p;
    double r = next_uniform(s) * mass, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[keep - 1].id;
}

/* the top-p cut of the first keep of the sorted c, then the draw among what it keeps */
static int32_t cut_and_draw(qf_sampler *s, const cand_t *c, int keep) {
    if (s->p.top_p < 1.0f) keep = top_p_cut(c, keep, s->p.top_p, NULL);
    return draw(s, c, keep);
}

/* a logit's weight before normalization: expf of its distance to the largest over temp (every
 * route's probabilities are these over their double sum) */
static inline float weight(float l, float lmax, float temp) { return expf((l - lmax) / temp); }

/* each candidate's probability, as the oracle computes it: its weight over the weights' double
 * sum (summed in token order) */
static void probabilities(qf_sampler *s, const float *logits, float lmax) {
    const int n = s->n_vocab;
    cand_t *c = s->cand;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        const float pr = weight(logits[i], lmax, s->p.temp);
        c[i].p = pr;
        c[i].id = i;
        sum += pr;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

int32_t qf_sample_candidates(qf_sampler *s, const int32_t *id, const float *logit, int n, float lmax, double sum) {
    if (n <= 0) return 0;
    cand_t *c = s->cand;
    if (n > s->n_vocab) n = s->n_vocab;
    for (int i = 0; i < n; i++) {
        c[i].p = (float)(weight(logit[i], lmax, s->p.temp) / sum);
        c[i].id = id[i];
    }
    qsort(c, (size_t)n, sizeof *c, by_prob_desc);
    return cut_and_draw(s, c, n);
}

int32_t qf_sample_ref(qf_sampler *s, const float *logits) {
    int n = s->n_vocab;
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->p.temp <= 0) return best;
    probabilities(s, logits, logits[best]);
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_prob_desc);
    return cut_and_draw(s, s->cand, s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n);
}

int32_t qf_sample(qf_sampler *s, const float *logits) {
    const int n = s->n_vocab;
    const int32_t best = argmax(logits, n);
    if (s->p.temp <= 0) return best;
    probabilities(s, logits, logits[best]);
    const int keep = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    if (s->p.top_p < 1.0f && keep == n) {
        /* no top-k: sort prefixes 1024, 4096, ... long until one reaches top_p (each is the
         * same prefix the full sort gives), the whole vocabulary at worst */
        for (int m = n < 1024 ? n : 1024;; m = m > n / 4 ? n : 4 * m) {
            select_sorted(s->cand, n, m);
            int reached;
            const int k = top_p_cut(s->cand, m, s->p.top_p, &reached);
            if (reached || m == n) return draw(s, s->cand, k);
        }
    }
    select_sorted(s->cand, n, keep);
    return cut_and_draw(s, s->cand, keep);
}
