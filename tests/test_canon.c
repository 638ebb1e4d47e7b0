/* test_canon.c: the canonical arithmetic (kernels/canon.h) on the CPU. Its kernels against their
 * scalar oracles bit for bit; the fast row kernels against their scalar fallbacks bit for bit;
 * and the canonical forward pass: the same logits, bit for bit, for any thread count, any batch
 * split (token by token = one batch), and any instruction set (AVX-512, AVX2 only, no SIMD),
 * on f16, q8_0, q4_0 and K-quant weights and several cache modes. The GPU's side of the same
 * contract is test_cuda's e2e_canonical. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/canon.h"
#include "kernels/canon_cpu.h"
#include "kernels/gemm.h"
#include "kernels/vecmath.h"
#include "qforge/awq.h"
#include "qforge/model.h"
#include "qforge/quant.h"
#include "test.h"
#include "util/util.h"

static void fill(float *x, size_t n, uint64_t *s, float amp) {
    for (size_t i = 0; i < n; i++) x[i] = amp * (float)(2.0 * qf_rand_unit(s) - 1.0);
}

TEST(kernels_match_their_oracles) {
    uint64_t s = 11;
    /* T around the AVX-512 scores' 32-key blocks (a masked last block of 1, 5, 6, 16 or 25 keys),
     * head_dim 64 / 128 (the four-query paths), 80 (AVX2's four-query path, AVX-512 declines), 20
     * (no SIMD pv) and 40 (AVX2's two-query path) */
    const int hds[] = {64, 20, 128, 128, 80, 128, 40}, Ts[] = {37, 16, 5, 70, 33, 57, 9};
    const bool avx512 = qf_quant_has_avx2() && qf_gemm_isa_get() == QF_GEMM_ISA_AVX512;
    for (int c = 0; c < 7; c++) {
        int hd = hds[c], T = Ts[c], nq = 7;
        float *Q = malloc(sizeof(float) * nq * hd), *K = malloc(sizeof(float) * T * hd), *V = malloc(sizeof(float) * (T + nq) * hd);
        float *S1 = calloc((size_t)nq * (T + nq), sizeof(float)), *S2 = calloc((size_t)nq * (T + nq), sizeof(float));
        float *O1 = malloc(sizeof(float) * nq * hd), *O2 = malloc(sizeof(float) * nq * hd);
        float *scr = malloc(sizeof(float) * QF_CANON_SCRATCH(hd));
        fill(Q, (size_t)nq * hd, &s, 2), fill(K, (size_t)T * hd, &s, 2), fill(V, (size_t)(T + nq) * hd, &s, 1);
        qf_canon_scores(Q, hd, nq, K, T, hd, 0.125f, S1, T + nq, scr);
        qf_canon_scores_ref(Q, hd, nq, K, T, hd, 0.125f, S2, T + nq);
        CHECK_MSG(memcmp(S1, S2, sizeof(float) * nq * (T + nq)) == 0, "scores hd %d T %d", hd, T);
        fill(S1, (size_t)nq * (T + nq), &s, 1);
        qf_canon_pv(S1, T + nq, nq, T, V, NULL, 0, 0, hd, O1, hd);
        qf_canon_pv_ref(S1, T + nq, nq, T, V, NULL, 0, 0, hd, O2, hd);
        CHECK_MSG(memcmp(O1, O2, sizeof(float) * nq * hd) == 0, "pv hd %d T %d", hd, T);
        /* with exact rows (2 sinks, a window of 5): the rows chosen per (query, key) */
        float *EV = malloc(sizeof(float) * (T + nq) * hd);
        fill(EV, (size_t)(T + nq) * hd, &s, 1);
        qf_canon_pv(S1, T + nq, nq, T, V, EV, 2, 5, hd, O1, hd);
        qf_canon_pv_ref(S1, T + nq, nq, T, V, EV, 2, 5, hd, O2, hd);
        CHECK_MSG(memcmp(O1, O2, sizeof(float) * nq * hd) == 0, "pv with exact rows hd %d T %d", hd, T);
        if (avx512) { /* the AVX-512 kernels themselves, whatever the dispatch picks */
            /* the columns past T (the next queries' own keys) must stay untouched: both start
             * from the same sentinel */
            float *S3 = malloc(sizeof(float) * nq * (T + nq));
            for (int q = 0; q < nq * (T + nq); q++) S3[q] = S2[q] = 7.0f;
            qf_canon_scores_avx512(Q, hd, nq, K, T, hd, 0.125f, S3, T + nq, scr);
            qf_canon_scores_ref(Q, hd, nq, K, T, hd, 0.125f, S2, T + nq);
            CHECK_MSG(memcmp(S3, S2, sizeof(float) * nq * (T + nq)) == 0, "avx512 scores hd %d T %d", hd, T);
            free(S3);
        }
        /* each P.V kernel itself, whatever the dispatch picks: AVX2 (four queries a pass at head_dim
         * % 16 == 0, else two), AVX-512 (head_dim % 64 == 0, else it declines) */
        typedef bool (*pv_fn)(const float *, int64_t, int, int, const float *, const float *, int, int, int, float *,
                              int64_t);
        const struct { pv_fn f; bool on; int mult; const char *name; } pvs[] = {
            {qf_canon_pv_avx2, qf_quant_has_avx2(), 8, "avx2"}, {qf_canon_pv_avx512, avx512, 64, "avx512"}};
        for (int k = 0; k < 2; k++)
            for (int ex = 0; pvs[k].on && ex < 2; ex++) {
                memset(O1, 0, sizeof(float) * nq * hd);
                bool ran = pvs[k].f(S1, T + nq, nq, T, V, ex ? EV : NULL, 2, 5, hd, O1, hd);
                qf_canon_pv_ref(S1, T + nq, nq, T, V, ex ? EV : NULL, 2, 5, hd, O2, hd);
                CHECK_MSG(ran == (hd % pvs[k].mult == 0), "%s pv ran for hd %d", pvs[k].name, hd);
                if (ran)
                    CHECK_MSG(memcmp(O1, O2, sizeof(float) * nq * hd) == 0, "%s pv hd %d T %d exact %d", pvs[k].name, hd, T,
                              ex);
            }
        free(EV);
        free(Q), free(K), free(V), free(S1), free(S2), free(O1), free(O2), free(scr);
    }
    const int Ks[] = {100, 64}, Rs[] = {37, 16}, Ns[] = {6, 1};
    for (int c = 0; c < 2; c++) {
        int Kd = Ks[c], R = Rs[c], n = Ns[c];
        float *W = malloc(sizeof(float) * R * Kd), *x = malloc(sizeof(float) * n * Kd);
        float *y1 = malloc(sizeof(float) * n * R), *y2 = malloc(sizeof(float) * n * R);
        float *scr = malloc(sizeof(float) * QF_CANON_SCRATCH(Kd));
        fill(W, (size_t)R * Kd, &s, 1), fill(x, (size_t)n * Kd, &s, 3);
        qf_canon_gemm_rows(W, Kd, R, x, n, y1, R, scr);
        qf_canon_gemm_rows_ref(W, Kd, R, x, n, y2, R);
        CHECK_MSG(memcmp(y1, y2, sizeof(float) * n * R) == 0, "gemm rows K %d R %d n %d", Kd, R, n);
        free(W), free(x), free(y1), free(y2), free(scr);
    }
}

/* the row kernels with and without AVX2 (qf_quant_force_scalar) give the same bits, and the
 * canonical exp stays within a few ulp of libm's */
TEST(row_kernels_same_bits_on_every_isa) {
    if (!qf_quant_has_avx2()) {
        qf_test_skip_reason = "this CPU has no AVX2: only the scalar kernels run";
        return;
    }
    uint64_t s = 5;
    const int ns[] = {1, 7, 8, 9, 63, 64, 65, 1000};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        int n = ns[c];
        float *x = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n);
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        fill(x, (size_t)n, &s, 30), fill(g, (size_t)n, &s, 2), fill(u, (size_t)n, &s, 2);
        for (int pass = 0; pass < 5; pass++) {
            double da = 0, db = 0;
            for (int v = 0; v < 2; v++) {
                qf_quant_force_scalar(v == 1);
                float *o = v ? b : a;
                memcpy(o, x, sizeof(float) * n);
                switch (pass) {
                case 0: qf_vec_exp(o, n); break;
                case 1: qf_softmax(o, n); break;
                case 2: qf_rmsnorm_row(o, x, g, n, 1e-5f); break;
                case 3: memcpy(o, g, sizeof(float) * n), qf_vec_silu_mul(o, u, n); break;
                default: *(v ? &db : &da) = qf_vec_sum_exp(x, n, 3.0f); break;
                }
            }
            qf_quant_force_scalar(false);
            CHECK_MSG(memcmp(a, b, sizeof(float) * n) == 0 && memcmp(&da, &db, sizeof da) == 0, "kernel %d n %d", pass, n);
        }
        free(x), free(g), free(u), free(a), free(b);
    }
    double worst = 0;
    for (float v = -87.0f; v < 88.0f; v += 0.0137f) {
        double e = fabs((double)qf_canon_exp(v) - exp((double)v)) / exp((double)v);
        if (e > worst) worst = e;
    }
    printf("  canonical exp vs exp: max relative error %.2e over [-87, 88]\n", worst);
    CHECK(worst < 4e-7);
    CHECK(qf_canon_exp(-100.0f) == 0.0f);
}

static const int32_t toks[] = {1, 403, 407, 261, 378, 300, 270, 280, 290, 310, 320, 330, 340, 350, 360, 370,
                               380, 390, 400, 410};
#define NT ((int)(sizeof toks / sizeof toks[0]))

/* logits of every token, `step` tokens per qf_decode call; NULL on failure */
static float *logits_of(qf_model *m, qf_context_params cp, int step, bool *canon) {
    qf_error e = {0};
    cp.n_ctx = 64;
    qf_context *c = qf_context_new(m, &cp, &e);
    if (!c) {
        fprintf(stderr, "  context: %s\n", e.msg);
        return NULL;
    }
    if (canon) *canon = qf_context_canonical(c);
    int V = qf_model_hparams(m)->n_vocab;
    float *lg = malloc((size_t)NT * V * sizeof(float));
    for (int i = 0; i < NT && lg; i += step) {
        int bs = NT - i < step ? NT - i : step;
        int32_t t[NT];
        for (int k = 0; k < bs; k++) t[k] = toks[i + k] % V;
        if (qf_decode(c, t, bs, i, lg + (size_t)i * V, 0, &e)) {
            fprintf(stderr, "  decode: %s\n", e.msg);
            free(lg);
            lg = NULL;
        }
    }
    qf_context_free(c);
    return lg;
}

typedef struct {
    const char *name;
    int threads, step;
    int isa; /* 0 default, 1 AVX2 cap, 2 no SIMD */
} variant;

/* every variant's logits equal the first's, bit for bit; the canonical route stays close to the
 * fast one */
static void check_model(qf_model *m, const char *label, qf_kv_mode kv, qf_kv_rot rot, const variant *vs, int nv) {
    qf_context_params cp = qf_context_default_params();
    cp.kv_k = cp.kv_v = kv;
    cp.kv_rot = rot;
    cp.canonical = true;
    size_t nl = (size_t)NT * qf_model_hparams(m)->n_vocab;
    float *base = NULL;
    for (int i = 0; i < nv; i++) {
        cp.n_threads = vs[i].threads;
        if (vs[i].isa == 1) qf_gemm_cap_isa(QF_GEMM_ISA_AVX2);
        if (vs[i].isa == 2) qf_quant_force_scalar(true);
        bool canon = false;
        float *lg = logits_of(m, cp, vs[i].step, &canon);
        qf_gemm_cap_isa(QF_GEMM_ISA_AVX512), qf_quant_force_scalar(false);
        CHECK_MSG(lg && canon, "%s kv %s: %s", label, qf_kv_mode_name(kv), vs[i].name);
        if (!lg) continue;
        if (!base) {
            base = lg;
            continue;
        }
        size_t diff = 0;
        for (size_t k = 0; k < nl; k++) diff += memcmp(&lg[k], &base[k], 4) != 0;
        CHECK_MSG(diff == 0, "%s kv %s%s: %s: %zu of %zu logits differ from %s", label, qf_kv_mode_name(kv),
                  rot ? "+had" : "", vs[i].name, diff, nl, vs[0].name);
        free(lg);
    }
    cp.canonical = false;
    cp.n_threads = 2;
    float *fast = logits_of(m, cp, NT, NULL);
    if (base && fast) {
        double mx = 0, sc = 0;
        for (size_t k = 0; k < nl; k++) {
            double d = fabs((double)base[k] - fast[k]);
            if (d > mx) mx = d;
            if (fabs(fast[k]) > sc) sc = fabs(fast[k]);
        }
        printf("  %-28s kv %-5s%-4s %d variants identical; canonical vs fast route %.2e (relative to max |logit|)\n",
               label, qf_kv_mode_name(kv), rot ? "+had" : "", nv, mx / sc);
        CHECK(mx / sc < 3e-2); /* q4_0: the q8_0 activations round last-bit differences up to ~1e-2 */
    }
    free(base), free(fast);
}

static qf_model *load_first(const char *const *rels, int n, const char **which) {
    for (int i = 0; i < n; i++) {
        const char *p = test_data(rels[i]);
        if (!p) continue;
        qf_error e = {0};
        qf_model *m = qf_model_load(p, &e);
        if (m) {
            *which = rels[i];
            return m;
        }
    }
    return NULL;
}

TEST(forward_same_bits_any_threads_batch_isa) {
    const char *f16s[] = {"models/qforge-demo-11m-f16.gguf"}, *which = NULL;
    qf_model *m = load_first(f16s, 1, &which);
    if (!m) {
        qf_test_skip_reason = "models/qforge-demo-11m-f16.gguf not in the data directory";
        return;
    }
    const variant all[] = {{"2 threads, one batch", 2, NT, 0}, {"1 thread", 1, NT, 0}, {"3 threads, token by token", 3, 1, 0},
                           {"2 threads, batches of 7", 2, 7, 0}, {"AVX2 only", 2, NT, 1}, {"no SIMD", 2, 5, 2}};
    const variant few[] = {{"2 threads, one batch", 2, NT, 0}, {"3 threads, token by token", 3, 1, 0}, {"AVX2 only", 2, 6, 1}};
    check_model(m, which, QF_KV_F16, QF_KV_ROT_NONE, all, 6);
    check_model(m, which, QF_KV_Q8_0, QF_KV_ROT_NONE, few, 3);
    check_model(m, which, QF_KV_Q4_0, QF_KV_ROT_HADAMARD, few, 3);
    check_model(m, which, QF_KV_F32, QF_KV_ROT_NONE, few, 2);
    /* q4_0 weights: the demo model quantized here (llama-quantize's rules) */
    char q4[4096];
    snprintf(q4, sizeof q4, "%s/demo-q4_0.gguf", test_tmpdir());
    qf_error e = {0};
    if (qf_quantize_model(test_data(which), q4, QF_TYPE_Q4_0, &e) == QF_OK) {
        qf_model *m4 = qf_model_load(q4, &e);
        CHECK(m4 != NULL);
        if (m4) check_model(m4, "demo 11m q4_0", QF_KV_F16, QF_KV_ROT_NONE, all, 6);
        qf_model_free(m4);
    } else
        CHECK_MSG(0, "quantize: %s", e.msg);
    qf_model_free(m);
    const char *q8s[] = {"models/qforge-demo-11m-q8_0.gguf"}, *kq[] = {"models/qforge-demo-11m-q4_k_m.gguf",
                                                                           "models/synthetic-qwen2-q4_k_m.gguf"},
               *qw[] = {"models/qforge-demo-qwen2-5m-f16.gguf", "models/synthetic-qwen2-f16.gguf"};
    const char *const *lists[] = {q8s, kq, qw};
    const int lens[] = {1, 2, 2};
    for (int l = 0; l < 3; l++) {
        if (!(m = load_first(lists[l], lens[l], &which))) {
            printf("  (no %s in the data directory)\n", lists[l][0]);
            continue;
        }
        check_model(m, which, QF_KV_F16, QF_KV_ROT_NONE, l == 1 ? all : few, l == 1 ? 6 : 3);
        qf_model_free(m);
    }
}

/* where the canonical arithmetic does not apply, the context says so */
TEST(canonical_flag_reports_coverage) {
    const char *p = test_data("models/qforge-demo-11m-f16.gguf");
    if (!p) {
        qf_test_skip_reason = "models/qforge-demo-11m-f16.gguf not in the data directory";
        return;
    }
    qf_error e = {0};
    qf_model *m = qf_model_load(p, &e);
    CHECK(m != NULL);
    if (!m) return;
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 32;
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK(c && !qf_context_canonical(c)); /* not asked for */
    qf_context_free(c);
    cp.canonical = cp.reference = true;
    c = qf_context_new(m, &cp, &e);
    CHECK(c && !qf_context_canonical(c)); /* the reference route wins */
    qf_context_free(c);
    cp.reference = false;
    c = qf_context_new(m, &cp, &e);
    CHECK(c && qf_context_canonical(c));
    qf_context_free(c);
    qf_model_free(m);
}

int main(void) {
    RUN(kernels_match_their_oracles);
    RUN(row_kernels_same_bits_on_every_isa);
    RUN(forward_same_bits_any_threads_batch_isa);
    RUN(canonical_flag_reports_coverage);
    return test_summary();
}
