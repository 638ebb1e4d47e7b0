/* test_capture.c: the capture stage: bounded KV reservoir, activation statistics, and the
 * cross-check of the two routes (scalar reference vs fast path capture the same vectors). */
#include <stdlib.h>

#include "qforge/capture.h"
#include "test.h"

static int32_t *demo_tokens(qf_model *m, int64_t *n) {
    const char *p = test_data("corpora/tinystories-sample-cs336.txt");
    if (!p) p = test_data("corpora/kerneldoc-demo/docs.txt"); /* a fresh clone: the embedded corpus */
    if (!p) return NULL;
    FILE *f = fopen(p, "rb");
    char buf[4096];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    int32_t *ids;
    size_t nn;
    qf_error e;
    if (qf_tokenize(qf_model_tokenizer(m), buf, len, true, false, &ids, &nn, &e)) return NULL;
    *n = (int64_t)nn;
    return ids;
}

static qf_capture *capture_with(qf_model *m, const int32_t *ids, int64_t n, bool reference, int64_t max_per_layer) {
    qf_error e = {0};
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    cp.reference = reference;
    cp.kv_k = cp.kv_v = QF_KV_F32;
    qf_context *c = qf_context_new(m, &cp, &e);
    qf_capture_params p = {.max_per_layer = max_per_layer, .activations = true, .seed = 7};
    qf_capture *cap = qf_capture_new(qf_model_hparams(m), &p, &e);
    CHECK(c && cap);
    CHECK(qf_capture_run(c, cap, ids, n, 128, 0, false, &e) == QF_OK);
    qf_context_free(c);
    return cap;
}

TEST(bounded_reservoir_and_two_routes) {
    const char *mp = test_data("models/qforge-demo-11m-f16.gguf");
    if (!mp) SKIP("demo model not in ../shared/data");
    qf_error e = {0};
    qf_model *m = qf_model_load(mp, &e);
    CHECK(m != NULL);
    int64_t n = 0;
    int32_t *ids = demo_tokens(m, &n);
    if (!ids) {
        qf_model_free(m);
        SKIP("corpus not in ../shared/data");
    }
    if (n > 384) n = 384;
    const qf_hparams *hp = qf_model_hparams(m);
    int64_t bound = 100; /* vectors per layer per stream: 50 tokens x 2 kv heads */
    qf_capture *fast = capture_with(m, ids, n, false, bound);
    qf_capture *ref = capture_with(m, ids, n, true, bound);
    qf_kv_capture_view v = qf_capture_kv_view(fast);
    for (int l = 0; l < hp->n_layer; l++) {
        CHECK(v.n_k[l] <= bound);
        CHECK_EQ_INT(v.n_k[l], bound);
        CHECK(v.n_k[l] % hp->n_head_kv == 0);
    }
    CHECK_EQ_INT(qf_capture_tokens_seen(fast), n);
    double d = qf_capture_max_rel_diff(ref, fast);
    printf("  reference vs fast route capture: max relative difference %.3e\n", d);
    CHECK(d < 1e-4);
    const qf_act_stats *a = qf_capture_act(fast, 0, QF_ACT_FFN_DOWN);
    CHECK(a && a->count == n && a->dim == hp->n_ff);
    double s = 0;
    for (int i = 0; i < a->dim; i++) {
        CHECK(a->max_abs[i] * a->count >= a->sum_abs[i] - 1e-3);
        s += a->sum_abs[i];
    }
    CHECK(s > 0);
    qf_capture_free(fast);
    qf_capture_free(ref);
    free(ids);
    qf_model_free(m);
}

TEST(no_tap_means_no_capture) {
    const char *mp = test_data("models/stories260K.gguf");
    if (!mp) mp = test_data("models/qforge-demo-11m-f16.gguf"); /* any small llama will do */
    if (!mp) SKIP("neither stories260K nor the demo model in $QF_DATA_DIR");
    qf_error e = {0};
    qf_model *m = qf_model_load(mp, &e);
    qf_capture_params p = {.max_per_layer = 64, .activations = false};
    qf_capture *cap = qf_capture_new(qf_model_hparams(m), &p, &e);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 16;
    qf_context *c = qf_context_new(m, &cp, &e);
    int32_t t[4] = {1, 403, 407, 261};
    CHECK(qf_decode(c, t, 4, 0, NULL, 4, &e) == QF_OK); /* no tap installed */
    qf_kv_capture_view v = qf_capture_kv_view(cap);
    CHECK_EQ_INT(v.n_k[0], 0);
    CHECK(qf_capture_run(c, cap, t, 0, 16, 0, false, &e) == QF_ERR_CAPTURE_FAILED);
    qf_context_free(c);
    qf_capture_free(cap);
    qf_model_free(m);
}

int main(void) {
    RUN(bounded_reservoir_and_two_routes);
    RUN(no_tap_means_no_capture);
    return test_summary();
}
