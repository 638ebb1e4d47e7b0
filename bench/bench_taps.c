/* bench_taps.c: what the capture taps cost. The forward pass of the demo model is timed with
 * no tap installed (production: one NULL check per site), with a tap whose callbacks do
 * nothing (the cost of the hook itself), and with the real capture (KV reservoir + activation
 * statistics). Runs alternate so background load hits all three alike; ratios are against the
 * no-tap baseline measured in the same run.
 *   build/bench/bench_taps [MODEL] [rounds]   (default assets/models/qforge-demo-11m-f16.gguf, 5) */
#include <stdio.h>
#include <stdlib.h>

#include "qforge/capture.h"
#include "qforge/model.h"
#include "util/util.h"

static void nop_kv(void *u, int l, int p, int n, int h, int d, const float *k, const float *v) {
    (void)u, (void)l, (void)p, (void)n, (void)h, (void)d, (void)k, (void)v;
}
static void nop_act(void *u, int l, qf_act_site s, int n, int d, const float *x) {
    (void)u, (void)l, (void)s, (void)n, (void)d, (void)x;
}

static double run(qf_context *c, const int32_t *toks, int n) {
    qf_error e;
    double t0 = qf_now_sec();
    if (qf_decode(c, toks, n, 0, NULL, n, &e)) {
        fprintf(stderr, "decode: %s\n", e.msg);
        exit(1);
    }
    return qf_now_sec() - t0;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "assets/models/qforge-demo-11m-f16.gguf";
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    qf_error e;
    qf_model *m = qf_model_load(path, &e);
    if (!m) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const qf_hparams *hp = qf_model_hparams(m);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 2;
    cp.device = QF_DEVICE_CPU;
    qf_context *c = qf_context_new(m, &cp, &e);
    int n = 512;
    int32_t *toks = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) toks[i] = (i * 7919) % hp->n_vocab;
    qf_tap nop = {.user = NULL, .on_kv = nop_kv, .on_act = nop_act};
    qf_capture_params capp = {.max_per_layer = 4096, .activations = true, .seed = 1};
    qf_capture *cap = qf_capture_new(hp, &capp, &e);
    double best[3] = {1e9, 1e9, 1e9};
    run(c, toks, n); /* warm up */
    for (int r = 0; r < rounds; r++) {
        const qf_tap *taps[3] = {NULL, &nop, qf_capture_tap(cap)};
        for (int k = 0; k < 3; k++) {
            qf_context_set_tap(c, taps[k]);
            double t = run(c, toks, n);
            if (t < best[k]) best[k] = t;
        }
    }
    qf_context_set_tap(c, NULL);
    printf("forward of %d tokens, %s, 2 threads, best of %d:\n", n, path, rounds);
    printf("  no tap (baseline)   %8.2f ms  %6.3fx\n", best[0] * 1e3, 1.0);
    printf("  empty tap           %8.2f ms  %6.3fx\n", best[1] * 1e3, best[1] / best[0]);
    printf("  capture (KV + act)  %8.2f ms  %6.3fx\n", best[2] * 1e3, best[2] / best[0]);
    qf_capture_free(cap);
    free(toks);
    qf_context_free(c);
    qf_model_free(m);
    return 0;
}
