/* sample.h: the sampler's scalar oracle, for the tests (the public entry is qforge/sample.h). */
#ifndef QF_ENGINE_SAMPLE_H
#define QF_ENGINE_SAMPLE_H

#include "qforge/sample.h"

/* qf_sample as first written: every candidate's probability, a full sort of the vocabulary,
 * then the top-k / top-p cuts and the draw. qf_sample must return the same token and leave the
 * generator in the same state for the same logits (tests/test_sample.c). */
int32_t qf_sample_ref(qf_sampler *s, const float *logits);

/* qf_sample at temp > 0 from the n largest logits of a row (logit[i] of token id[i], in any
 * order; the row's top-k when top_k >= 1, n = min(top_k, finite logits)), its largest lmax and
 * sum = the sum over the row of expf((l - lmax) / temp) in double: the decode step's reduction on
 * the GPU (qf_gpu_topk). The same token as qf_sample on the whole row when sum has the same bits
 * (tests/test_sample.c). */
int32_t qf_sample_candidates(qf_sampler *s, const int32_t *id, const float *logit, int n, float lmax, double sum);

#endif
