/* bench_kvrq_rows.c: kv-rq's row route (forward.c's kv_gather_worker: the canonical route of
 * certification and `ppl --artifact`) reading one layer of a cache whose V is predicted from the
 * stored K, at an 8B shape (8 kv heads of 128, format-3 rows at 2 bits, a dense V predictor).
 * Baseline: each V head read by qf_kv_cache_read_head, which decodes every K head's row of each
 * position again for the prediction (n_head_kv^2 K decodes a position). Against it, in the same
 * run: the K heads read once, then each V head by qf_kv_cache_read_head_vpred from them. Both
 * on one thread (the forward pass spreads the heads over its pool the same way); the V floats
 * must be equal. Random codec parameters: the decode does the work a learned one does.
 *
 *   build/bench/bench_kvrq_rows [positions] [rounds]   (default 1024, 3) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "format/kv_rq_row.h"
#include "util/util.h"

enum { NH = 8, HD = 128, DKV = NH * HD, LV = QF_KV_RQ_MAX_LEVELS };

static uint64_t rs = 7;
static float frand(void) { return (float)(qf_rand_unit(&rs) * 2.0 - 1.0); }

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 1024, rounds = argc > 2 ? atoi(argv[2]) : 3;
    if (T < 1 || rounds < 1) {
        fprintf(stderr, "usage: %s [positions >= 1] [rounds >= 1]\n", argv[0]);
        return 2;
    }
    qf_hparams hp = {0};
    hp.n_layer = 1, hp.n_head_kv = NH, hp.head_dim = HD;
    static const int bits[1] = {2};
    float *levels = malloc(sizeof(float) * NH * LV), *mean = calloc(DKV, sizeof(float)), *cs = malloc(sizeof(float) * DKV),
          *enc = malloc(sizeof(float) * NH * HD * HD), *sigma = malloc(sizeof(float) * DKV),
          *klev = malloc(sizeof(float) * DKV * LV), *pred = malloc(sizeof(float) * DKV * DKV),
          *k = malloc(sizeof(float) * (size_t)T * DKV), *v = malloc(sizeof(float) * (size_t)T * DKV),
          *kdec = malloc(sizeof(float) * (size_t)NH * T * HD), *v1 = malloc(sizeof(float) * (size_t)NH * T * HD),
          *v2 = malloc(sizeof(float) * (size_t)NH * T * HD);
    uint8_t *width = malloc(DKV);
    if (!levels || !mean || !cs || !enc || !sigma || !klev || !pred || !k || !v || !kdec || !v1 || !v2 || !width) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int i = 0; i < NH * LV; i++) levels[i] = -1.5f + (float)(i % LV); /* ascending per head */
    for (int i = 0; i < DKV; i++) cs[i] = 1.0f, sigma[i] = 1.0f, width[i] = 2;
    for (int i = 0; i < DKV * LV; i++) klev[i] = -1.2f + 0.8f * (float)(i % LV); /* 4 ascending levels used */
    for (size_t i = 0; i < (size_t)NH * HD * HD; i++) enc[i] = frand() * 0.1f;
    for (size_t i = 0; i < (size_t)DKV * DKV; i++) pred[i] = frand() * 0.03f;
    for (size_t i = 0; i < (size_t)T * DKV; i++) k[i] = frand(), v[i] = frand();
    qf_kv_stream_spec spec[2];
    for (int s = 0; s < 2; s++)
        spec[s] = (qf_kv_stream_spec){.mode = QF_KV_RQ, .rq_bits = bits, .rq_levels = levels, .rq_mean = mean,
                                      .rq_cs = cs, .rq_klt_enc = enc, .rq_klt_dec = enc, .rq_klt_sigma = sigma,
                                      .rq_klt_levels = klev, .rq_klt_width = width};
    spec[0].prerope = true;
    spec[1].rq_pred = pred;
    qf_kv_cache kv;
    qf_error e = {0};
    if (qf_kv_cache_init_spec(&kv, &hp, T, spec, &e)) {
        fprintf(stderr, "cache: %s\n", e.msg);
        return 1;
    }
    qf_kv_cache_write(&kv, 0, 0, 0, T, k);
    qf_kv_cache_write(&kv, 1, 0, 0, T, v);
    const size_t hs = (size_t)T * HD;
    double tb = 1e30, tn = 1e30, tk = 1e30;
    for (int r = 0; r < rounds; r++) { /* alternating, best of each */
        double t0 = qf_now_sec();
        for (int h = 0; h < NH; h++) qf_kv_cache_read_head(&kv, 1, 0, h, T, v1 + h * hs);
        double t1 = qf_now_sec();
        for (int h = 0; h < NH; h++) qf_kv_cache_read_head(&kv, 0, 0, h, T, kdec + h * hs);
        double t2 = qf_now_sec();
        for (int h = 0; h < NH; h++) qf_kv_cache_read_head_vpred(&kv, 0, h, T, kdec, hs, v2 + h * hs);
        double t3 = qf_now_sec();
        tb = t1 - t0 < tb ? t1 - t0 : tb, tk = t2 - t1 < tk ? t2 - t1 : tk, tn = t3 - t1 < tn ? t3 - t1 : tn;
    }
    const bool same = memcmp(v1, v2, sizeof(float) * NH * hs) == 0;
    printf("bench_kvrq_rows: %d positions, %d kv heads of %d, format-3 rows at 2 bits, V predicted from K\n", T, NH, HD);
    printf("  V heads, each decoding the K rows again (baseline): %8.1f ms\n", 1e3 * tb);
    printf("  K heads once, then V heads from them:                %8.1f ms (the K read alone %.1f ms): x%.2f\n",
           1e3 * tn, 1e3 * tk, tb / tn);
    printf("  (the baseline's K read is the same %.1f ms, so the layer's gather goes %.1f -> %.1f ms: x%.2f)\n",
           1e3 * tk, 1e3 * (tb + tk), 1e3 * tn, (tb + tk) / tn);
    printf("  V floats %s\n", same ? "equal" : "DIFFER");
    qf_kv_cache_free(&kv);
    free(levels), free(mean), free(cs), free(enc), free(sigma), free(klev), free(pred), free(k), free(v), free(kdec),
        free(v1), free(v2), free(width);
    return same ? 0 : 1;
}
