/* qforge/sample.h: next-token sampling (temperature, top-k, top-p) with a seeded generator,
 * so a given seed reproduces the same text. */
#ifndef QFORGE_SAMPLE_H
#define QFORGE_SAMPLE_H

#include "qforge/api.h"
#include <stdint.h>

typedef struct {
    float temp;   /* <= 0: greedy (argmax) */
    int top_k;    /* <= 0: no top-k cut */
    float top_p;  /* >= 1: no nucleus cut */
    uint64_t seed;
} qf_sampler_params;

typedef struct {
    qf_sampler_params p;
    uint64_t state;
    int n_vocab;
    struct qf_prob_idx { float p; int32_t id; } *cand;
} qf_sampler;

QF_API int qf_sampler_init(qf_sampler *s, const qf_sampler_params *p, int n_vocab); /* 0 ok, -1 oom */
QF_API void qf_sampler_free(qf_sampler *s);
QF_API int32_t qf_sample(qf_sampler *s, const float *logits);

#endif
