/* test_forward.c: the forward pass. The fast route (sgemm tiles, AVX2 kernels, threads) is
 * checked against the scalar reference route; incremental decode against batched prefill; the
 * KV storage modes against f32; and stories260K's greedy continuation against the published one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kernels/gemm.h"
#include "qforge/awq.h"
#include "qforge/model.h"
#include "qforge/sample.h"
#include "test.h"

static qf_model *load(const char *rel) { /* rel: under the shared data directory, or an absolute path */
    const char *p = rel[0] == '/' ? rel : test_data(rel);
    if (!p) return NULL;
    qf_error e = {0};
    qf_model *m = qf_model_load(p, &e);
    if (!m) fprintf(stderr, "  load %s: %s\n", rel, e.msg);
    return m;
}

static float *run_logits(qf_model *m, const int32_t *toks, int n, qf_context_params cp, int step) {
    qf_error e = {0};
    cp.n_ctx = 64;
    qf_context *c = qf_context_new(m, &cp, &e);
    if (!c) return NULL;
    int V = qf_model_hparams(m)->n_vocab;
    float *lg = malloc((size_t)n * V * sizeof(float));
    for (int i = 0; i < n; i += step) {
        int bs = n - i < step ? n - i : step;
        if (qf_decode(c, toks + i, bs, i, lg + (size_t)i * V, 0, &e)) {
            fprintf(stderr, "  decode: %s\n", e.msg);
            free(lg);
            lg = NULL;
            break;
        }
    }
    qf_context_free(c);
    return lg;
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
    double mx = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > mx) mx = d;
        if (fabs(a[i]) > scale) scale = fabs(a[i]);
    }
    return mx / (scale > 0 ? scale : 1);
}

static const int32_t toks[] = {1, 403, 407, 261, 378, 300, 270, 280, 290, 310, 320, 330, 340, 350, 360, 370,
                               380, 390, 400, 410};
#define NT ((int)(sizeof toks / sizeof toks[0]))

static void check_routes(const char *rel, double tol) {
    qf_model *m = load(rel);
    if (!m) {
        qf_test_skip_reason = "model not in ../shared/data";
        return;
    }
    int V = qf_model_hparams(m)->n_vocab;
    int32_t t[NT];
    for (int i = 0; i < NT; i++) t[i] = toks[i] % V;
    qf_context_params cp = qf_context_default_params();
    cp.kv_k = cp.kv_v = QF_KV_F32;
    cp.n_threads = 2;
    qf_context_params ref = cp;
    ref.reference = true;
    ref.n_threads = 1;
    float *a = run_logits(m, t, NT, ref, NT);   /* oracle, one batch */
    float *b = run_logits(m, t, NT, cp, NT);    /* fast, prefill */
    float *d = run_logits(m, t, NT, cp, 1);     /* fast, token by token (vec_dot route) */
    CHECK(a && b && d);
    if (a && b && d) {
        double e1 = max_rel_diff(a, b, (size_t)NT * V), e2 = max_rel_diff(a, d, (size_t)NT * V);
        printf("  %s: prefill vs oracle %.2e, decode vs oracle %.2e\n", rel, e1, e2);
        CHECK_MSG(e1 < tol, "prefill vs oracle %.3e", e1);
        /* decode quantizes activations to the weights' vec_dot type (Q8_0 / Q8_K) as ggml
         * does, so it differs from the f32 oracle by that rounding; the argmax must agree */
        CHECK_MSG(e2 < 5e-2, "decode vs oracle %.3e", e2);
        int agree = 0;
        for (int p = 0; p < NT; p++) {
            int ia = 0, id = 0;
            for (int k = 1; k < V; k++) {
                if (a[(size_t)p * V + k] > a[(size_t)p * V + ia]) ia = k;
                if (d[(size_t)p * V + k] > d[(size_t)p * V + id]) id = k;
            }
            agree += ia == id;
        }
        CHECK_MSG(agree >= NT - 1, "argmax agrees at %d of %d positions", agree, NT);
    }
    free(a), free(b), free(d);
    qf_model_free(m);
}

/* Without ../shared (a fresh clone) the routes are checked on the random-weight fixtures of the
 * same shapes (tests/helpers/make_fixtures.sh, bench/gen_model_shapes): the route agreement does
 * not depend on what the weights learned. */
static const char *or_fixture(const char *rel, const char *fixture) { return test_data(rel) ? rel : fixture; }
TEST(stories260k_fast_matches_reference) {
    check_routes(or_fixture("models/stories260K.gguf", "models/synthetic-hd8-f32.gguf"), 1e-4);
}
TEST(demo_f16_fast_matches_reference) { check_routes("models/qforge-demo-11m-f16.gguf", 1e-3); }
/* 5e-2: its Q8_0 / Q4_K / Q6_K tensors take the int8 GEMM (kernels/gemm.h) on AVX-512 VNNI CPUs, which quantizes
 * the activations to Q8_0 as decode and ggml do */
TEST(demo_q4km_fast_matches_reference) { check_routes("models/qforge-demo-11m-q4_k_m.gguf", 5e-2); }
TEST(qwen2_fast_matches_reference) {
    check_routes(or_fixture("models/qforge-demo-qwen2-5m-f16.gguf", "models/synthetic-qwen2-f16.gguf"), 1e-3);
}
/* Q4_K and Q6_K matrices of width 256 (n_embd 256): decode takes the K-format matvec kernels
 * (kernels/matvec.h) on AVX-512 VNNI CPUs; the fixture is gen_model_shapes' q4_k_m mix */
TEST(qwen2_q4km_fast_matches_reference) {
    check_routes(or_fixture("models/qforge-demo-qwen2-5m-q4_k_m.gguf", "models/synthetic-qwen2-q4_k_m.gguf"), 5e-2);
}

/* Q4_0 weights (the demo model quantized here: every matrix Q4_0, the head Q8_0): the fast routes
 * against the oracle, where on AVX-512 VNNI CPUs the CPU context reads the model's repacked copy
 * (engine/repack.c) for decode and prefill; and prefill from the repacked copy bit-identical to
 * prefill from the GGUF rows (QF_NO_REPACK=1 on a second load of the same file). */
TEST(demo_q4_0_repacked_matches) {
    const char *src = test_data("models/qforge-demo-11m-f16.gguf");
    if (!src) SKIP("models/qforge-demo-11m-f16.gguf not in ../shared/data");
    static char q4[4200];
    snprintf(q4, sizeof q4, "%s/demo-q4_0.gguf", test_tmpdir());
    qf_error e = {0};
    CHECK(qf_quantize_model(src, q4, QF_TYPE_Q4_0, &e) == QF_OK);
    check_routes(q4, 5e-2);
    qf_model *a = qf_model_load(q4, &e), *b = qf_model_load(q4, &e);
    CHECK(a && b);
    if (!a || !b) {
        qf_model_free(a), qf_model_free(b);
        return;
    }
    CHECK_EQ_INT(qf_model_layer(a, 0)->wq.type, QF_TYPE_Q4_0);
    int V = qf_model_hparams(a)->n_vocab;
    int32_t t[NT];
    for (int i = 0; i < NT; i++) t[i] = toks[i] % V;
    qf_context_params cp = qf_context_default_params();
    cp.kv_k = cp.kv_v = QF_KV_F32;
    cp.n_threads = 2;
    float *la = run_logits(a, t, NT, cp, NT);
    setenv("QF_NO_REPACK", "1", 1);
    float *lb = run_logits(b, t, NT, cp, NT);
    unsetenv("QF_NO_REPACK");
    CHECK(la && lb);
    bool repacked = qf_model_repacked(a, &qf_model_layer(a, 0)->wq) != NULL;
    CHECK(repacked == qf_gemm_q4x16_supported());
    CHECK(!qf_model_repacked(b, &qf_model_layer(b, 0)->wq));
    if (!repacked) printf("  (no AVX-512 VNNI here: no repacked copy, both runs read the GGUF rows)\n");
    if (la && lb) {
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)NT * V; i++) bad += memcmp(&la[i], &lb[i], 4) != 0;
        CHECK_MSG(bad == 0, "prefill repacked vs GGUF rows: %zu of %zu logits differ", bad, (size_t)NT * V);
    }
    free(la), free(lb);
    qf_model_free(a), qf_model_free(b);
}

/* Only the rows from logits_from on need the last layer's attention output, o-projection and FFN
 * (forward.c skips the others), and the prefill GEMMs split their rows between threads in chunks that
 * depend on the thread count: the logits asked for must be the bits of a full one-thread prefill, for
 * any logits_from (inside and at the edge of an attention block of 64 queries) and any thread count. */
static float *prefill_rows(qf_model *m, const int32_t *t, int n, int from, int threads) {
    qf_error e = {0};
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 160;
    cp.n_threads = threads;
    qf_context *c = qf_context_new(m, &cp, &e);
    if (!c) return NULL;
    int V = qf_model_hparams(m)->n_vocab;
    float *lg = malloc((size_t)(n - from) * V * sizeof(float));
    if (qf_decode(c, t, n, 0, lg, from, &e)) {
        fprintf(stderr, "  decode: %s\n", e.msg);
        free(lg);
        lg = NULL;
    }
    qf_context_free(c);
    return lg;
}

static void check_logits_from(const char *rel) {
    qf_model *m = load(rel);
    if (!m) SKIP("model not in ../shared/data");
    enum { N = 150 };
    int V = qf_model_hparams(m)->n_vocab;
    int32_t t[N];
    uint64_t s = 12345;
    for (int i = 0; i < N; i++) t[i] = (int32_t)(qf_xorshift64s(&s) % (uint64_t)V);
    float *all = prefill_rows(m, t, N, 0, 1);
    CHECK(all != NULL);
    const int froms[] = {75, 128, 146}, thr[] = {1, 3};
    for (int a = 0; all && a < 3; a++)
        for (int b = 0; b < 2; b++) {
            float *part = prefill_rows(m, t, N, froms[a], thr[b]);
            CHECK(part != NULL);
            if (!part) continue;
            size_t bad = 0, cnt = (size_t)(N - froms[a]) * V;
            for (size_t i = 0; i < cnt; i++) bad += memcmp(&part[i], &all[(size_t)froms[a] * V + i], 4) != 0;
            CHECK_MSG(bad == 0, "%s, logits from %d, %d threads: %zu of %zu logits differ from the full prefill", rel,
                      froms[a], thr[b], bad, cnt);
            free(part);
        }
    free(all);
    qf_model_free(m);
}
TEST(logits_from_bit_identical_f16) { check_logits_from("models/qforge-demo-11m-f16.gguf"); }
TEST(logits_from_bit_identical_q4km) { check_logits_from("models/qforge-demo-11m-q4_k_m.gguf"); }

TEST(kv_modes_close_to_f32) {
    qf_model *m = load("models/qforge-demo-11m-f16.gguf");
    if (!m) SKIP("demo model not in ../shared/data");
    int V = qf_model_hparams(m)->n_vocab;
    int32_t t[NT];
    for (int i = 0; i < NT; i++) t[i] = toks[i] % V;
    qf_context_params cp = qf_context_default_params();
    cp.n_threads = 2;
    cp.kv_k = cp.kv_v = QF_KV_F32;
    float *base = run_logits(m, t, NT, cp, NT);
    qf_kv_mode modes[] = {QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0};
    double tols[] = {2e-3, 2e-2, 2e-1};
    for (int i = 0; i < 3; i++) {
        cp.kv_k = cp.kv_v = modes[i];
        float *l = run_logits(m, t, NT, cp, NT);
        CHECK(l != NULL);
        if (l) {
            double e = max_rel_diff(base, l, (size_t)NT * V);
            printf("  kv %s vs f32: %.2e\n", qf_kv_mode_name(modes[i]), e);
            CHECK_MSG(e < tols[i], "kv %s: %.3e", qf_kv_mode_name(modes[i]), e);
            CHECK(e > 0);
        }
        free(l);
    }
    free(base);
    qf_model_free(m);
}

TEST(stories260k_greedy_matches_llama2c) {
    qf_model *m = load("models/stories260K.gguf");
    if (!m) SKIP("stories260K not in ../shared/data");
    const qf_tokenizer *tok = qf_model_tokenizer(m);
    qf_error e = {0};
    int32_t *ids;
    size_t n;
    CHECK(qf_tokenize(tok, "Once upon a time", 16, true, false, &ids, &n, &e) == QF_OK);
    CHECK_EQ_INT(n, 5);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK(c != NULL);
    int V = qf_model_hparams(m)->n_vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    CHECK(qf_decode(c, ids, (int)n, 0, lg, (int)n - 1, &e) == QF_OK);
    qf_sampler s;
    qf_sampler_params sp = {.temp = 0};
    qf_sampler_init(&s, &sp, V);
    char out[2048] = "";
    size_t len = 0;
    int pos = (int)n;
    for (int i = 0; i < 40; i++) {
        int32_t next = qf_sample(&s, lg);
        char piece[64];
        int pl = qf_token_to_piece(tok, next, false, piece, sizeof piece);
        if (pl > 0 && len + (size_t)pl < sizeof out) {
            memcpy(out + len, piece, (size_t)pl);
            len += (size_t)pl;
            out[len] = 0;
        }
        if (qf_decode(c, &next, 1, pos++, lg, 0, &e)) break;
    }
    printf("  continuation: %s\n", out);
    CHECK(strstr(out, ", there was a little girl named Lily. She loved to play outside in the park.") == out);
    qf_sampler_free(&s);
    free(lg);
    free(ids);
    qf_context_free(c);
    qf_model_free(m);
}

/* The small llama these checks run on: stories260K when ../shared has it, else the embedded
 * demo model (a fresh clone): what they check (bad token ids, a swapped or missing tensor, an
 * unknown architecture) does not depend on which llama it is. */
static const char *any_llama(void) {
    static char path[4096];
    const char *p = test_data("models/stories260K.gguf");
    if (!p) p = test_data("models/qforge-demo-11m-f16.gguf");
    if (!p && access("assets/models/qforge-demo-11m-f16.gguf", R_OK) == 0) p = "assets/models/qforge-demo-11m-f16.gguf";
    if (!p) return NULL;
    snprintf(path, sizeof path, "%s", p);
    return path;
}

TEST(decode_rejects_bad_input) {
    const char *mp = any_llama();
    qf_error le = {0};
    qf_model *m = mp ? qf_model_load(mp, &le) : NULL;
    if (!m) SKIP("no small llama model (stories260K in ../shared/data, or assets/models)");
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 8;
    qf_error e = {0};
    qf_context *c = qf_context_new(m, &cp, &e);
    int32_t bad[] = {1, 100000};
    CHECK(qf_decode(c, bad, 2, 0, NULL, 2, &e) == QF_ERR_ARG);
    CHECK(strstr(e.msg, "token id") != NULL);
    int32_t ok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK(qf_decode(c, ok, 4, 6, NULL, 4, &e) == QF_ERR_ARG); /* past n_ctx */
    CHECK(qf_decode(c, ok, 9, 0, NULL, 9, &e) == QF_ERR_ARG); /* batch > n_batch */
    qf_context_free(c);
    qf_model_free(m);
}

TEST(unsupported_and_missing_models) {
    qf_error e = {0};
    CHECK(qf_model_load("/nonexistent.gguf", &e) == NULL);
    CHECK(strstr(e.msg, "/nonexistent.gguf") != NULL);
    const char *vocab = test_data("vocab/ggml-vocab-bert-bge.gguf");
    if (!vocab) SKIP("vocab files not in ../shared/data");
    CHECK(qf_model_load(vocab, &e) == NULL);
    CHECK_MSG(e.code == QF_ERR_UNSUPPORTED, "%s", e.msg); /* bert: not llama/qwen2 */
    CHECK(strstr(e.msg, "bert") != NULL);
    const char *spm = test_data("vocab/ggml-vocab-llama-spm.gguf");
    if (spm) {
        CHECK(qf_model_load(spm, &e) == NULL); /* llama arch, but no tensors */
        CHECK_MSG(e.code == QF_ERR_FORMAT, "%s", e.msg);
        printf("  vocab-only llama: %s\n", e.msg);
    }
}

/* Rewrite a small llama (any_llama) with one change and check the loader names the file and the field. */
static void check_mutant(const char *what, const char *arch, const char *swap_tensor, const char *drop_tensor,
                         qf_status want, const char *want_text) {
    const char *src = any_llama();
    if (!src) {
        qf_test_skip_reason = "no small llama model (stories260K in ../shared/data, or assets/models)";
        return;
    }
    qf_error e = {0};
    qf_gguf *g = qf_gguf_open(src, &e);
    CHECK(g != NULL);
    qf_gguf_writer *w = qf_gguf_writer_new();
    CHECK(qf_gguf_writer_copy_kv(w, g, NULL, &e) == QF_OK);
    if (arch) qf_gguf_writer_set_str(w, "general.architecture", arch);
    for (uint64_t i = 0; i < qf_gguf_n_tensors(g); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (drop_tensor && !strcmp(name, drop_tensor)) continue;
        const qf_gguf_tensor *use = t;
        if (swap_tensor && !strcmp(name, swap_tensor)) use = qf_gguf_find_tensor(g, "blk.0.attn_k.weight");
        CHECK(qf_gguf_writer_add_tensor(w, name, use->type, use->n_dims, use->ne, use->data, use->nbytes, &e) == QF_OK);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/mutant.gguf", test_tmpdir());
    CHECK(qf_gguf_writer_write(w, path, &e) == QF_OK);
    qf_gguf_writer_free(w);
    qf_gguf_close(g);
    qf_model *m = qf_model_load(path, &e);
    CHECK(m == NULL);
    printf("  %s: %s\n", what, e.msg);
    CHECK_MSG(e.code == want, "%s: got %s", what, qf_status_name(e.code));
    CHECK_MSG(strstr(e.msg, want_text) != NULL, "%s: message lacks '%s'", what, want_text);
    CHECK(strstr(e.msg, "mutant.gguf") != NULL);
    qf_model_free(m);
}

TEST(shape_mismatch_named) {
    check_mutant("shape", NULL, "blk.0.attn_q.weight", NULL, QF_ERR_FORMAT, "blk.0.attn_q.weight");
}
TEST(missing_tensor_named) {
    check_mutant("missing", NULL, NULL, "blk.3.ffn_down.weight", QF_ERR_FORMAT, "blk.3.ffn_down.weight");
}
TEST(unknown_architecture_named) {
    check_mutant("arch", "gptj", NULL, NULL, QF_ERR_UNSUPPORTED, "gptj");
}

int main(void) {
    RUN(stories260k_fast_matches_reference);
    RUN(demo_f16_fast_matches_reference);
    RUN(demo_q4km_fast_matches_reference);
    RUN(qwen2_fast_matches_reference);
    RUN(qwen2_q4km_fast_matches_reference);
    RUN(demo_q4_0_repacked_matches);
    RUN(logits_from_bit_identical_f16);
    RUN(logits_from_bit_identical_q4km);
    RUN(kv_modes_close_to_f32);
    RUN(stories260k_greedy_matches_llama2c);
    RUN(decode_rejects_bad_input);
    RUN(unsupported_and_missing_models);
    RUN(shape_mismatch_named);
    RUN(missing_tensor_named);
    RUN(unknown_architecture_named);
    return test_summary();
}
