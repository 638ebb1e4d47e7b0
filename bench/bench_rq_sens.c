/* bench_rq_sens.c: the host work around each of kv-rq's sensitivity passes (pipeline.c: 64 at
 * the 8B shape, each binding a payload with one (layer, stream) at 2 bits and the rest f16,
 * then unbinding), on a CPU context of a model file at its real shape. A fit is learned from
 * synthetic K / V rows (format 3 and the V predictor, as `calibrate --bits 2.5` learns them),
 * then for the first P units: the payload built whole (qf_kv_rq_payload, the baseline) against
 * rewritten in place (qf_kv_rq_payload_update, what the loop does since session 25; the two
 * payloads must be equal), then the bind with the payload's arrays copied (qf_context_bind_payload,
 * the baseline) against read in place (qf_context_bind_payload_in_place, what the certifier does
 * since session 26), and the unbind. Medians of the passes after the first; the GPU context's
 * own upload (rq_state_new) is not in it.
 *
 *   build/bench/gen_model_shapes --shape llama3-8b --type q4_0 -o /tmp/l8q.gguf
 *   build/bench/bench_rq_sens /tmp/l8q.gguf [passes] [rows per layer]   (default 6, 600) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/kv_rq_row.h"
#include "qforge/artifact.h"
#include "qforge/artifact_bind.h"
#include "qforge/kv_rq.h"
#include "qforge/model.h"
#include "util/util.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [passes >= 2] [rows per layer >= 200]\n", argv[0]);
        return 2;
    }
    int P = argc > 2 ? atoi(argv[2]) : 6, N = argc > 3 ? atoi(argv[3]) : 600;
    if (P < 2 || N < 200) {
        fprintf(stderr, "usage: %s MODEL.gguf [passes >= 2] [rows per layer >= 200]\n", argv[0]);
        return 2;
    }
    qf_error e = {0};
    qf_model *m = qf_model_load(argv[1], &e);
    if (!m) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const qf_hparams *hp = qf_model_hparams(m);
    int L = hp->n_layer, H = hp->n_head_kv, D = hp->head_dim, HD = H * D;
    if (P > 2 * L) P = 2 * L;
    float **k = calloc((size_t)L, sizeof(float *)), **v = calloc((size_t)L, sizeof(float *));
    int64_t *nk = malloc(sizeof(int64_t) * L), *nv = malloc(sizeof(int64_t) * L);
    uint64_t rs = 1;
    for (int l = 0; l < L; l++) { /* a few strong directions per head; V partly predictable from K */
        k[l] = malloc(sizeof(float) * (size_t)N * HD), v[l] = malloc(sizeof(float) * (size_t)N * HD);
        if (!k[l] || !v[l]) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < (size_t)N * HD; i++) {
            float r = (float)(qf_rand_unit(&rs) - 0.5);
            k[l][i] = r * (float)(1 + i % 7), v[l][i] = 0.5f * k[l][i] + (float)(qf_rand_unit(&rs) - 0.5);
        }
        nk[l] = nv[l] = (int64_t)N * H;
    }
    qf_kv_capture_view cv = {.n_layer = L, .n_kv_head = H, .head_dim = D, .k = (const float *const *)k,
                             .v = (const float *const *)v, .n_k = nk, .n_v = nv};
    qf_kv_rq_learn_params lp;
    qf_kv_rq_learn_params_default(&lp);
    lp.v_pred = true, lp.lloyd_iters = 4, lp.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    qf_kv_rq_fit f;
    memset(&f, 0, sizeof f);
    double t0 = qf_now_sec();
    if (qf_kv_rq_learn(&cv, &lp, &f, &e) || qf_kv_rq_learn_klt(&cv, NULL, NULL, &lp, &f, &e)) {
        fprintf(stderr, "learn: %s\n", e.msg);
        return 1;
    }
    f.klt->eighths = true, f.k_prerope = true;
    printf("%s: %d layers x %d kv heads x %d, a synthetic format-3 fit with a V predictor (%.1f MB) in %.1f s\n",
           argv[1], L, H, D, (double)L * HD * HD * 4 / 1e6, qf_now_sec() - t0);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 512, cp.n_threads = lp.n_threads;
    qf_context *c = qf_context_new(m, &cp, &e);
    if (!c) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    int *bits[2] = {malloc(sizeof(int) * L), malloc(sizeof(int) * L)};
    double *tb = malloc(sizeof(double) * P), *tu = malloc(sizeof(double) * P), *ti = malloc(sizeof(double) * P),
           *tp = malloc(sizeof(double) * P), *to = malloc(sizeof(double) * P);
    qf_payload upd = {0};
    bool equal = true;
    for (int u = 0; u < P; u++) {
        for (int s = 0; s < 2; s++)
            for (int l = 0; l < L; l++) bits[s][l] = QF_KV_RQ_BITS_F16;
        bits[u % 2][u / 2] = QF_KV_RQ_SENS_BITS;
        qf_payload whole = {0};
        double a = qf_now_sec();
        qf_status st = qf_kv_rq_payload(&f, (const int *const *)bits, 4, 28, &whole, &e);
        double b = qf_now_sec();
        if (!st) st = upd.n ? qf_kv_rq_payload_update(&f, (const int *const *)bits, 4, 28, &upd, &e)
                            : qf_kv_rq_payload(&f, (const int *const *)bits, 4, 28, &upd, &e);
        double cc = qf_now_sec();
        if (!st) st = qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &upd, &e);
        double c2 = qf_now_sec();
        if (!st) st = qf_context_unbind(c, &e);
        double d0 = qf_now_sec();
        if (!st) st = qf_context_bind_payload_in_place(c, QF_ARTIFACT_KV_RQ, &upd, &e);
        double d = qf_now_sec();
        if (!st) st = qf_context_unbind(c, &e);
        double ee = qf_now_sec();
        if (st) {
            fprintf(stderr, "pass %d: %s\n", u, e.msg);
            return 1;
        }
        equal &= qf_payload_equal(&whole, &upd);
        qf_payload_free(&whole);
        tb[u] = b - a, tu[u] = cc - b, ti[u] = c2 - cc, tp[u] = d - d0, to[u] = ee - d;
        printf("pass %d: payload whole %.3f s, rewritten %.3f s; bind copied %.3f s, in place %.3f s; unbind %.3f s\n",
               u, tb[u], tu[u], ti[u], tp[u], to[u]);
    }
    double mb = median(tb + 1, P - 1), mu = median(tu + 1, P - 1), mi = median(ti + 1, P - 1),
           mp = median(tp + 1, P - 1), mo = median(to + 1, P - 1);
    printf("median of passes 1..%d: payload whole %.4f s, rewritten %.4f s (%.0fx less); bind copied %.3f s, in place "
           "%.3f s (%.1fx less); unbind %.4f s; host time a pass (whole + copied) %.3f s -> (rewritten + in place) "
           "%.3f s (%.2fx); payloads equal: %s\n",
           P - 1, mb, mu, mu > 0 ? mb / mu : 0, mi, mp, mp > 0 ? mi / mp : 0, mo, mb + mi + mo, mu + mp + mo,
           (mb + mi + mo) / (mu + mp + mo), equal ? "yes" : "NO");
    qf_payload_free(&upd);
    qf_context_free(c);
    qf_kv_rq_fit_free(&f);
    for (int l = 0; l < L; l++) free(k[l]), free(v[l]);
    free(k), free(v), free(nk), free(nv), free(bits[0]), free(bits[1]), free(tb), free(tu), free(ti), free(tp), free(to);
    qf_model_free(m);
    return equal ? 0 : 1;
}
