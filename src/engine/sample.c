/* sample.c: next-token sampling. Greedy at temp <= 0; otherwise softmax(logits / temp), keep the
 * top-k most likely tokens, then the smallest prefix whose mass reaches top-p, and draw from
 * what is left with a seeded xorshift64* generator. */
#include <math.h>
#include <stdlib.h>

#include "qforge/sample.h"
#include "util/util.h"

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
    const struct qf_prob_idx *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

int32_t qf_sample(qf_sampler *s, const float *logits) {
    int n = s->n_vocab;
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->p.temp <= 0) return best;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float pr = expf((logits[i] - logits[best]) / s->p.temp);
        s->cand[i].p = pr;
        s->cand[i].id = i;
        sum += pr;
    }
    for (int i = 0; i < n; i++) s->cand[i].p = (float)(s->cand[i].p / sum);
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_prob_desc);
    int keep = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < keep; i++) {
            cum += s->cand[i].p;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    double mass = 0;
    for (int i = 0; i < keep; i++) mass += s->cand[i].p;
    double r = next_uniform(s) * mass, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += s->cand[i].p;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[keep - 1].id;
}
