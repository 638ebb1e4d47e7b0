/* test_sample.c: qf_sample (top-k by a heap, prefixes for top-p) against its oracle
 * qf_sample_ref (a full sort of the vocabulary): the same token and the same generator state
 * for every setting, on logits with ties, a flat tail and one dominant token; and the draw from a
 * row's top-k and sum (the GPU's reduction, qf_sample_candidates) against the oracle on the row. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample.h"
#include "test.h"
#include "util/util.h"

/* logits of kind k: 0 uniform in [0, 10), 1 a few dozen distinct values (many ties), 2 one
 * token far above a flat tail, 3 normal-like (sum of uniforms) scaled to LLM-like spreads */
static void fill(float *l, int n, int k, uint64_t *st) {
    for (int i = 0; i < n; i++) {
        const double u = (double)(qf_xorshift64s(st) >> 11) / 9007199254740992.0;
        if (k == 0) l[i] = (float)(10.0 * u);
        else if (k == 1) l[i] = (float)(int)(u * 37.0) * 0.25f;
        else if (k == 2) l[i] = (float)(u * 1e-3);
        else {
            double s = 0;
            for (int j = 0; j < 4; j++) s += (double)(qf_xorshift64s(st) >> 11) / 9007199254740992.0;
            l[i] = (float)((s - 2.0) * 6.0);
        }
    }
    if (k == 2) l[(int)(qf_xorshift64s(st) % (uint64_t)n)] = 12.0f;
}

TEST(sample_matches_full_sort_oracle) {
    const int sizes[] = {1, 2, 7, 1000, 6000};
    const float temps[] = {0.0f, 0.05f, 0.8f, 1.0f, 3.0f};
    const int topk[] = {0, 1, 40, 999, 100000};
    const float topp[] = {1.0f, 0.95f, 0.999f, 0.0f};
    uint64_t st = 12345;
    int cases = 0, same = 0;
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
        const int n = sizes[a];
        float *l = malloc((size_t)n * sizeof *l);
        for (int kind = 0; kind < 4; kind++) {
            fill(l, n, kind, &st);
            for (size_t b = 0; b < sizeof temps / sizeof *temps; b++)
                for (size_t c = 0; c < sizeof topk / sizeof *topk; c++)
                    for (size_t d = 0; d < sizeof topp / sizeof *topp; d++) {
                        qf_sampler_params p = {.temp = temps[b], .top_k = topk[c], .top_p = topp[d], .seed = 77 + cases};
                        qf_sampler x, y;
                        CHECK(qf_sampler_init(&x, &p, n) == 0 && qf_sampler_init(&y, &p, n) == 0);
                        int ok = 1;
                        for (int r = 0; r < 3; r++) /* the generator advances: three draws a setting */
                            ok &= qf_sample(&x, l) == qf_sample_ref(&y, l);
                        ok &= x.state == y.state;
                        same += ok, cases++;
                        qf_sampler_free(&x), qf_sampler_free(&y);
                    }
        }
        free(l);
    }
    printf("  %d of %d settings: the same tokens and generator state\n", same, cases);
    CHECK_EQ_INT(same, cases);
}

/* the row's k largest logits (equal values: the lower ids), as the GPU's decode_topk selects
 * them, handed over in a scrambled order */
static int by_logit_desc(const void *a, const void *b) {
    const float x = ((const float *)a)[0], y = ((const float *)b)[0];
    if (x != y) return x < y ? 1 : -1;
    return ((const int32_t *)a)[1] - ((const int32_t *)b)[1];
}

TEST(sample_candidates_match_full_row) {
    const int n = 6000;
    float *l = malloc((size_t)n * sizeof *l), *pair = malloc((size_t)n * 2 * sizeof *pair);
    int32_t id[256];
    float lg[256];
    uint64_t st = 99;
    int cases = 0, same = 0;
    const int topk[] = {1, 2, 40, 256};
    const float temps[] = {0.3f, 0.8f, 1.5f}, topp[] = {1.0f, 0.95f, 0.5f};
    for (int kind = 0; kind < 4; kind++) {
        fill(l, n, kind, &st);
        for (int i = 0; i < n; i++) memcpy(&pair[2 * i], &l[i], 4), memcpy(&pair[2 * i + 1], &(int32_t){i}, 4);
        qsort(pair, (size_t)n, 2 * sizeof *pair, by_logit_desc);
        float lmax = pair[0];
        for (size_t a = 0; a < sizeof topk / sizeof *topk; a++)
            for (size_t b = 0; b < sizeof temps / sizeof *temps; b++)
                for (size_t c = 0; c < sizeof topp / sizeof *topp; c++) {
                    const int k = topk[a];
                    for (int j = 0; j < k; j++) { /* reversed: the order does not matter */
                        memcpy(&lg[k - 1 - j], &pair[2 * j], 4);
                        memcpy(&id[k - 1 - j], &pair[2 * j + 1], 4);
                    }
                    double sum = 0;
                    for (int i = 0; i < n; i++) sum += expf((l[i] - lmax) / temps[b]);
                    qf_sampler_params p = {.temp = temps[b], .top_k = k, .top_p = topp[c], .seed = 5 + cases};
                    qf_sampler x, y;
                    CHECK(qf_sampler_init(&x, &p, n) == 0 && qf_sampler_init(&y, &p, n) == 0);
                    int ok = 1;
                    for (int r = 0; r < 3; r++) ok &= qf_sample_candidates(&x, id, lg, k, lmax, sum) == qf_sample_ref(&y, l);
                    same += ok && x.state == y.state, cases++;
                    qf_sampler_free(&x), qf_sampler_free(&y);
                }
    }
    printf("  %d of %d settings: the same tokens from the top-k as from the whole row\n", same, cases);
    CHECK_EQ_INT(same, cases);
    free(pair);
    free(l);
}

/* greedy takes the first index of the largest logit, as the oracle's loop does */
TEST(sample_greedy_first_max) {
    float l[6] = {1, 5, 2, 5, -1, 5};
    qf_sampler s;
    qf_sampler_params p = {.temp = 0};
    CHECK(qf_sampler_init(&s, &p, 6) == 0);
    CHECK_EQ_INT(qf_sample(&s, l), 1);
    CHECK_EQ_INT(qf_sample_ref(&s, l), 1);
    qf_sampler_free(&s);
}

int main(void) {
    RUN(sample_matches_full_sort_oracle);
    RUN(sample_candidates_match_full_row);
    RUN(sample_greedy_first_max);
    return test_summary();
}
