/* test_families.c: qwen3, qwen3moe, mixtral (llama MoE), gemma2, gemma3 and phi3 against Hugging
 * Face transformers. tests/fixtures/families/<fam>.gguf are tiny random-weight models that
 * tools/hf_families.py built with transformers 5.17 / torch 2.11 (float32) and wrote with
 * tools/families_gguf.py; <fam>.logits are transformers' logits for 128 fixed tokens. qforge's
 * prefill must reach normalized MSE <= 1e-5 and top-1 agreement >= 99% per family, on the fast
 * route and on the reference route; incremental decode must agree with prefill (sliding-window
 * masks and expert routing on the vec_dot route). Also the loader's refusals for what a family
 * file may ask that qforge does not do, each naming the key or the tensor. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "qforge/awq.h"
#include "qforge/gguf.h"
#include "qforge/model.h"
#include "test.h"

#define FIX "tests/fixtures/families/"
static const char *const families[] = {"qwen3", "qwen3moe", "qwen2moe", "mixtral", "gemma2", "gemma3", "phi3"};
#define N_FAM (int)(sizeof families / sizeof families[0])

/* logits of every token: batches of `step` tokens (step >= n: one prefill) */
static float *run(qf_model *m, const test_logits *r, bool reference, int step, qf_kv_mode kv) {
    qf_error e = {0};
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = step < r->n_tok ? step : 0; /* small batches: sliding-window layers keep a ring */
    cp.n_threads = 2;
    cp.reference = reference;
    cp.device = QF_DEVICE_CPU;
    cp.kv_k = cp.kv_v = kv;
    qf_context *c = qf_context_new(m, &cp, &e);
    if (!c) {
        fprintf(stderr, "  context: %s\n", e.msg);
        return NULL;
    }
    float *lg = malloc((size_t)r->n_tok * r->n_vocab * sizeof(float));
    for (int i = 0; lg && i < r->n_tok; i += step) {
        int bs = r->n_tok - i < step ? r->n_tok - i : step;
        if (qf_decode(c, r->tokens + i, bs, i, lg + (size_t)i * r->n_vocab, 0, &e)) {
            fprintf(stderr, "  decode: %s\n", e.msg);
            free(lg);
            lg = NULL;
        }
    }
    qf_context_free(c);
    return lg;
}

/* normalized MSE sum (a - b)^2 / sum b^2 and the fraction of rows whose argmax agrees */
static void compare(const float *a, const float *b, int n_tok, int V, double *nmse, double *top1) {
    double se = 0, ss = 0;
    int agree = 0;
    for (int t = 0; t < n_tok; t++) {
        const float *x = a + (size_t)t * V, *y = b + (size_t)t * V;
        int ax = 0, ay = 0;
        for (int i = 0; i < V; i++) {
            double d = (double)x[i] - y[i];
            se += d * d;
            ss += (double)y[i] * y[i];
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        agree += ax == ay;
    }
    *nmse = se / (ss > 0 ? ss : 1);
    *top1 = (double)agree / n_tok;
}

static qf_model *load_fam(const char *fam, test_logits *r) {
    char path[256];
    snprintf(path, sizeof path, FIX "%s.logits", fam);
    if (!test_read_logits(path, r)) return NULL;
    snprintf(path, sizeof path, FIX "%s.gguf", fam);
    qf_error e = {0};
    qf_model *m = qf_model_load(path, &e);
    if (!m) fprintf(stderr, "  load %s: %s\n", path, e.msg);
    return m;
}

/* every family: fast prefill, reference prefill (f32 cache) and the default f16 cache */
TEST(families_match_transformers) {
    FILE *probe = fopen(FIX "qwen3.gguf", "rb");
    if (!probe) SKIP("tests/fixtures/families not found (run from the repository root)");
    fclose(probe);
    for (int fi = 0; fi < N_FAM; fi++) {
        test_logits r;
        qf_model *m = load_fam(families[fi], &r);
        CHECK_MSG(m != NULL, "%s: model or reference logits did not load", families[fi]);
        if (!m) {
            test_free_logits(&r);
            continue;
        }
        CHECK_EQ_INT(qf_model_hparams(m)->n_vocab, r.n_vocab);
        struct {
            const char *name;
            bool reference;
            qf_kv_mode kv;
            double max_nmse;
        } routes[] = {{"fast", false, QF_KV_F32, 1e-5}, {"reference", true, QF_KV_F32, 1e-5}, {"fast f16-cache", false, QF_KV_F16, 1e-3}};
        /* (the f16 cache may flip an expert choice of the MoE routers: a larger, honest error) */
        for (int ri = 0; ri < 3; ri++) {
            float *lg = run(m, &r, routes[ri].reference, r.n_tok, routes[ri].kv);
            CHECK(lg != NULL);
            if (!lg) continue;
            double nmse, top1;
            compare(lg, r.logits, r.n_tok, r.n_vocab, &nmse, &top1);
            printf("  %-9s %-15s nMSE %.3e  top-1 %.4f\n", families[fi], routes[ri].name, nmse, top1);
            CHECK_MSG(nmse <= routes[ri].max_nmse, "%s %s: nMSE %.3e", families[fi], routes[ri].name, nmse);
            CHECK_MSG(top1 >= 0.99, "%s %s: top-1 %.4f", families[fi], routes[ri].name, top1);
            free(lg);
        }
        qf_model_free(m);
        test_free_logits(&r);
    }
}

/* decode one token at a time (and in batches of 5) = prefill: the sliding window and the
 * expert routing on the vec_dot route, the cache read back across calls */
TEST(families_decode_matches_prefill) {
    FILE *probe = fopen(FIX "qwen3.gguf", "rb");
    if (!probe) SKIP("tests/fixtures/families not found (run from the repository root)");
    fclose(probe);
    for (int fi = 0; fi < N_FAM; fi++) {
        test_logits r;
        qf_model *m = load_fam(families[fi], &r);
        CHECK(m != NULL);
        if (!m) {
            test_free_logits(&r);
            continue;
        }
        float *pre = run(m, &r, false, r.n_tok, QF_KV_F32);
        float *one = run(m, &r, false, 1, QF_KV_F32);
        float *five = run(m, &r, false, 5, QF_KV_F32);
        CHECK(pre && one && five);
        if (pre && one && five) {
            double n1, t1, n5, t5;
            compare(one, pre, r.n_tok, r.n_vocab, &n1, &t1);
            compare(five, pre, r.n_tok, r.n_vocab, &n5, &t5);
            CHECK_MSG(n1 <= 1e-8 && t1 >= 0.99, "%s: decode vs prefill nMSE %.3e top-1 %.4f", families[fi], n1, t1);
            CHECK_MSG(n5 <= 1e-8 && t5 >= 0.99, "%s: 5-token batches vs prefill nMSE %.3e top-1 %.4f", families[fi], n5, t5);
        }
        free(pre), free(one), free(five);
        qf_model_free(m);
        test_free_logits(&r);
    }
}

/* qforge quantize on every family: the q8_0 and q4_0 files load, run and stay near
 * transformers. Loose bounds: random-weight models amplify weight error far more than trained
 * ones (q8_0 nMSE 3e-4..2e-2, q4_0 4e-2..2e-1 here; the MoE routers flip on it) */
TEST(families_quantized) {
    FILE *probe = fopen(FIX "qwen3.gguf", "rb");
    if (!probe) SKIP("tests/fixtures/families not found (run from the repository root)");
    fclose(probe);
    struct { qf_type type; double max_nmse, min_top1; } qs[] = {{QF_TYPE_Q8_0, 5e-2, 0.85}, {QF_TYPE_Q4_0, 0.4, 0.4}};
    for (int fi = 0; fi < N_FAM; fi++) {
        test_logits r;
        char src[256], out[512];
        snprintf(src, sizeof src, FIX "%s.logits", families[fi]);
        CHECK(test_read_logits(src, &r));
        snprintf(src, sizeof src, FIX "%s.gguf", families[fi]);
        for (int qi = 0; qi < 2; qi++) {
            snprintf(out, sizeof out, "%s/%s-%s.gguf", test_tmpdir(), families[fi], qf_type_name(qs[qi].type));
            qf_error e = {0};
            CHECK_MSG(qf_quantize_model(src, out, qs[qi].type, &e) == QF_OK, "%s: %s", families[fi], e.msg);
            qf_model *m = qf_model_load(out, &e);
            CHECK_MSG(m != NULL, "%s", e.msg);
            if (!m) continue;
            float *lg = run(m, &r, false, r.n_tok, QF_KV_F32);
            CHECK(lg != NULL);
            if (lg) {
                double nmse, top1;
                compare(lg, r.logits, r.n_tok, r.n_vocab, &nmse, &top1);
                printf("  %-9s %-15s nMSE %.3e  top-1 %.4f\n", families[fi], qf_type_name(qs[qi].type), nmse, top1);
                CHECK_MSG(nmse <= qs[qi].max_nmse && top1 >= qs[qi].min_top1, "%s %s: nMSE %.3e top-1 %.4f", families[fi],
                          qf_type_name(qs[qi].type), nmse, top1);
            }
            free(lg);
            qf_model_free(m);
        }
        test_free_logits(&r);
    }
}

/* AWQ on the dense families whose tensors it can fold into (qwen3, gemma2, gemma3): with the
 * scales folded and the weights kept in float the model is the same function, so it still
 * matches transformers; phi3 (fused tensors) and the MoE families are refused by name */
TEST(families_awq_fold) {
    FILE *probe = fopen(FIX "qwen3.gguf", "rb");
    if (!probe) SKIP("tests/fixtures/families not found (run from the repository root)");
    fclose(probe);
    const char *dense[] = {"qwen3", "gemma2", "gemma3"};
    for (int fi = 0; fi < 3; fi++) {
        test_logits r;
        qf_model *m = load_fam(dense[fi], &r);
        CHECK(m != NULL);
        if (!m) {
            test_free_logits(&r);
            continue;
        }
        qf_awq_params p = qf_awq_default_params();
        p.keep_float = true;
        p.clip = false;
        p.fixed_alpha = 0.5f;
        p.rows_per_site = 64;
        p.n_ctx = 64;
        p.n_threads = 2;
        char out[512];
        snprintf(out, sizeof out, "%s/%s-folded.gguf", test_tmpdir(), dense[fi]);
        qf_error e = {0};
        CHECK_MSG(qf_awq_run(m, r.tokens, r.n_tok, &p, out, NULL, &e) == QF_OK, "%s: %s", dense[fi], e.msg);
        qf_model_free(m);
        m = qf_model_load(out, &e);
        CHECK_MSG(m != NULL, "%s", e.msg);
        float *lg = m ? run(m, &r, false, r.n_tok, QF_KV_F32) : NULL;
        if (lg) {
            double nmse, top1;
            compare(lg, r.logits, r.n_tok, r.n_vocab, &nmse, &top1);
            printf("  %-9s awq-folded      nMSE %.3e  top-1 %.4f\n", dense[fi], nmse, top1);
            CHECK_MSG(nmse <= 1e-8 && top1 >= 0.99, "%s folded: nMSE %.3e top-1 %.4f", dense[fi], nmse, top1);
        }
        free(lg);
        qf_model_free(m);
        test_free_logits(&r);
    }
    const char *refused[][2] = {{"phi3", "fused tensors"}, {"mixtral", "mixture-of-experts"}, {"qwen3moe", "mixture-of-experts"},
                                {"qwen2moe", "mixture-of-experts"}};
    for (int i = 0; i < 4; i++) {
        test_logits r;
        qf_model *m = load_fam(refused[i][0], &r);
        CHECK(m != NULL);
        if (m) {
            qf_awq_params p = qf_awq_default_params();
            char out[512];
            snprintf(out, sizeof out, "%s/%s-awq.gguf", test_tmpdir(), refused[i][0]);
            qf_error e = {0};
            CHECK(qf_awq_run(m, r.tokens, r.n_tok, &p, out, NULL, &e) == QF_ERR_UNSUPPORTED);
            CHECK_MSG(strstr(e.msg, refused[i][1]) != NULL, "%s", e.msg);
            FILE *f = fopen(out, "rb");
            CHECK(f == NULL); /* nothing half-written */
            if (f) fclose(f);
            qf_model_free(m);
        }
        test_free_logits(&r);
    }
}

/* sliding-window layers keep only their window plus one batch: the cache is smaller, and a
 * rewind further back than the ring reaches is refused (start again at 0 works) */
TEST(families_swa_ring) {
    test_logits r;
    qf_model *m = load_fam("gemma2", &r);
    if (!m) SKIP("gemma2 fixture not found");
    qf_error e = {0};
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 2;
    cp.device = QF_DEVICE_CPU;
    qf_context *full = qf_context_new(m, &cp, &e);
    cp.n_batch = 4;
    qf_context *ring = qf_context_new(m, &cp, &e);
    CHECK(full && ring);
    if (full && ring) {
        /* 13 of 26 layers keep 32 - 1 + 4 = 35 of 256 positions */
        double want = qf_context_kv_bytes_per_token(full) * (13.0 + 13.0 * 35.0 / 256.0) / 26.0;
        CHECK_NEAR(qf_context_kv_bytes_per_token(ring), want, 1e-6 * want);
        int V = r.n_vocab;
        float *lg = malloc((size_t)4 * V * sizeof(float));
        for (int i = 0; i < 100; i += 4) CHECK(qf_decode(ring, r.tokens + i, 4, i, lg, 0, &e) == QF_OK);
        CHECK(qf_decode(ring, r.tokens + 10, 4, 10, lg, 0, &e) == QF_ERR_ARG);
        CHECK(strstr(e.msg, "no longer holds position") != NULL);
        CHECK(qf_decode(ring, r.tokens + 60, 4, 96, lg, 0, &e) == QF_OK); /* [65, 96) is still in the ring */
        CHECK(qf_decode(ring, r.tokens, 4, 0, lg, 0, &e) == QF_OK);
        free(lg);
    }
    qf_context_free(full);
    qf_context_free(ring);
    qf_model_free(m);
    test_free_logits(&r);
}

/* a cache that stores K before RoPE (kv-dict v2) rotates on read with each layer's base:
 * gemma3's local and global layers give the same logits as rotating first */
TEST(families_prerope_k) {
    test_logits r;
    qf_model *m = load_fam("gemma3", &r);
    if (!m) SKIP("gemma3 fixture not found");
    float *plain = run(m, &r, false, r.n_tok, QF_KV_F32);
    qf_error e = {0};
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 2;
    cp.device = QF_DEVICE_CPU;
    cp.kv_k = cp.kv_v = QF_KV_F32;
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK(c != NULL && plain != NULL);
    float *lg = malloc((size_t)r.n_tok * r.n_vocab * sizeof(float));
    if (c && plain && lg) {
        c->kv.k_prerope = true;
        for (int i = 0; i < r.n_tok; i += 32) CHECK(qf_decode(c, r.tokens + i, 32, i, lg + (size_t)i * r.n_vocab, 0, &e) == QF_OK);
        double nmse, top1;
        compare(lg, r.logits, r.n_tok, r.n_vocab, &nmse, &top1);
        CHECK_MSG(nmse <= 1e-10 && top1 >= 0.99, "pre-RoPE K cache: nMSE %.3e vs transformers", nmse);
    }
    free(lg);
    free(plain);
    qf_context_free(c);
    qf_model_free(m);
    test_free_logits(&r);
}

TEST(families_hparams) {
    test_logits r;
    qf_model *m = load_fam("gemma3", &r);
    if (!m) SKIP("gemma3 fixture not found");
    const qf_hparams *hp = qf_model_hparams(m);
    CHECK_EQ_INT(hp->arch, QF_ARCH_GEMMA3);
    CHECK(hp->qk_norm && hp->post_norms && hp->ffn_act == QF_FFN_GELU_TANH);
    CHECK_EQ_INT(hp->n_swa, 24);
    CHECK(qf_hparams_layer_swa(hp, 0) && qf_hparams_layer_swa(hp, 4) && !qf_hparams_layer_swa(hp, 5));
    CHECK(hp->rope_freq_base == 1e6f && hp->rope_freq_base_swa == 1e4f);
    char buf[512];
    CHECK(strstr(qf_hparams_features(hp, buf, sizeof buf), "sliding window 24") != NULL);
    qf_model_free(m);
    test_free_logits(&r);
    m = load_fam("mixtral", &r);
    CHECK(m != NULL);
    if (m) {
        hp = qf_model_hparams(m);
        CHECK(hp->arch == QF_ARCH_LLAMA && hp->n_expert == 4 && hp->n_expert_used == 2 && hp->rope_type == QF_ROPE_NORM);
        CHECK(strstr(qf_hparams_features(hp, buf, sizeof buf), "moe (4 experts, top-2") != NULL);
        qf_model_free(m);
    }
    test_free_logits(&r);
    m = load_fam("phi3", &r);
    CHECK(m != NULL);
    if (m) {
        hp = qf_model_hparams(m);
        CHECK(hp->fused_qkv && hp->fused_gate_up && hp->swa == QF_SWA_ALL && hp->n_swa == 4096);
        qf_model_free(m);
    }
    test_free_logits(&r);
    m = load_fam("qwen2moe", &r); /* q/k/v biases, top-k not renormalized, a shared expert */
    CHECK(m != NULL);
    if (m) {
        hp = qf_model_hparams(m);
        CHECK(hp->arch == QF_ARCH_QWEN2MOE && hp->n_expert == 8 && hp->n_expert_used == 2 && !hp->expert_norm_w &&
              hp->n_ff_exp == 32 && hp->n_ff_shexp == 64 && hp->rope_type == QF_ROPE_NEOX);
        CHECK(qf_model_layer(m, 0)->bq.data && qf_model_layer(m, 2)->w_down_shexp.data);
        CHECK(strstr(qf_hparams_features(hp, buf, sizeof buf), "shared expert (ff 64, sigmoid-gated)") != NULL);
        qf_model_free(m);
    }
    test_free_logits(&r);
}

/* Copy src with `key` set to a u32 (or, with key NULL, unchanged) and an extra tensor
 * (extra != NULL) or without tensor `drop`, into dir/name; returns the path (static). */
static const char *variant(const char *src_path, const char *name, const char *key, uint32_t val, const char *str_key,
                           const char *str_val, const char *extra, const char *drop) {
    static char out[512];
    qf_error e = {0};
    qf_gguf *src = qf_gguf_open(src_path, &e);
    if (!src) return NULL;
    qf_gguf_writer *w = qf_gguf_writer_new();
    qf_gguf_writer_copy_kv(w, src, NULL, &e);
    if (key) qf_gguf_writer_set_u32(w, key, val);
    if (str_key) qf_gguf_writer_set_str(w, str_key, str_val);
    for (uint64_t i = 0; i < qf_gguf_n_tensors(src); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(src, i);
        char nm[128];
        snprintf(nm, sizeof nm, "%.*s", (int)t->name.len, t->name.ptr);
        if (drop && strcmp(nm, drop) == 0) continue;
        qf_gguf_writer_add_tensor(w, nm, t->type, t->n_dims, t->ne, t->data, t->nbytes, &e);
    }
    static float zeros[64];
    int64_t ne[1] = {64};
    if (extra) qf_gguf_writer_add_tensor(w, extra, QF_TYPE_F32, 1, ne, zeros, sizeof zeros, &e);
    snprintf(out, sizeof out, "%s/%s", test_tmpdir(), name);
    qf_status st = qf_gguf_writer_write(w, out, &e);
    qf_gguf_writer_free(w);
    qf_gguf_close(src);
    return st ? NULL : out;
}

static void expect_refusal(const char *path, qf_status code, const char *needle) {
    CHECK(path != NULL);
    if (!path) return;
    qf_error e = {0};
    qf_model *m = qf_model_load(path, &e);
    CHECK_MSG(m == NULL, "%s loaded", path);
    qf_model_free(m);
    CHECK_MSG(e.code == code && strstr(e.msg, needle) != NULL, "code %d msg '%s' (wanted %d, '%s')", (int)e.code, e.msg,
              (int)code, needle);
}

TEST(families_refusals) {
    FILE *probe = fopen(FIX "gemma3.gguf", "rb");
    if (!probe) SKIP("tests/fixtures/families not found (run from the repository root)");
    fclose(probe);
    /* an architecture qforge does not run */
    expect_refusal(variant(FIX "qwen3.gguf", "a.gguf", NULL, 0, "general.architecture", "falcon", NULL, NULL),
                   QF_ERR_UNSUPPORTED, "general.architecture 'falcon'");
    /* a tensor the family's graph would ignore (bitnet's sub-norm on a qwen3) */
    expect_refusal(variant(FIX "qwen3.gguf", "b.gguf", NULL, 0, NULL, NULL, "blk.0.attn_sub_norm.weight", NULL),
                   QF_ERR_UNSUPPORTED, "tensor 'blk.0.attn_sub_norm.weight' is not used");
    /* gemma3 without its sliding window */
    {
        qf_error e = {0};
        qf_gguf *src = qf_gguf_open(FIX "gemma3.gguf", &e);
        CHECK(src != NULL);
        if (src) {
            qf_gguf_writer *w = qf_gguf_writer_new();
            qf_gguf_writer_copy_kv(w, src, "gemma3.attention.sliding_window", &e);
            for (uint64_t i = 0; i < qf_gguf_n_tensors(src); i++) {
                const qf_gguf_tensor *t = qf_gguf_tensor_at(src, i);
                char nm[128];
                snprintf(nm, sizeof nm, "%.*s", (int)t->name.len, t->name.ptr);
                qf_gguf_writer_add_tensor(w, nm, t->type, t->n_dims, t->ne, t->data, t->nbytes, &e);
            }
            char out[512];
            snprintf(out, sizeof out, "%s/c.gguf", test_tmpdir());
            CHECK(qf_gguf_writer_write(w, out, &e) == QF_OK);
            qf_gguf_writer_free(w);
            qf_gguf_close(src);
            expect_refusal(out, QF_ERR_FORMAT, "gemma3.attention.sliding_window");
        }
    }
    /* experts on a family without an MoE graph */
    expect_refusal(variant(FIX "gemma2.gguf", "d.gguf", "gemma2.expert_count", 4, NULL, NULL, NULL, NULL),
                   QF_ERR_UNSUPPORTED, "gemma2.expert_count");
    /* MoE: top-k larger than the expert count; a missing expert tensor */
    expect_refusal(variant(FIX "qwen3moe.gguf", "e.gguf", "qwen3moe.expert_used_count", 9, NULL, NULL, NULL, NULL),
                   QF_ERR_FORMAT, "qwen3moe.expert_used_count");
    expect_refusal(variant(FIX "mixtral.gguf", "f.gguf", NULL, 0, NULL, NULL, NULL, "blk.1.ffn_up_exps.weight"),
                   QF_ERR_FORMAT, "blk.1.ffn_up_exps.weight");
    /* phi3 LongRoPE factors */
    expect_refusal(variant(FIX "phi3.gguf", "g.gguf", NULL, 0, NULL, NULL, "rope_factors_long.weight", NULL),
                   QF_ERR_UNSUPPORTED, "rope_factors_long.weight");
    /* gemma3: a sliding-window pattern of 0 layers; gemma2: a negative soft-cap */
    expect_refusal(variant(FIX "gemma3.gguf", "i.gguf", "gemma3.attention.sliding_window_pattern", 0, NULL, NULL, NULL, NULL),
                   QF_ERR_FORMAT, "sliding-window pattern 0");
    {
        qf_error e = {0};
        qf_gguf *src = qf_gguf_open(FIX "gemma2.gguf", &e);
        CHECK(src != NULL);
        if (src) {
            qf_gguf_writer *w = qf_gguf_writer_new();
            qf_gguf_writer_copy_kv(w, src, NULL, &e);
            qf_gguf_writer_set_f32(w, "gemma2.attn_logit_softcapping", -1.0f);
            for (uint64_t i = 0; i < qf_gguf_n_tensors(src); i++) {
                const qf_gguf_tensor *t = qf_gguf_tensor_at(src, i);
                char nm[128];
                snprintf(nm, sizeof nm, "%.*s", (int)t->name.len, t->name.ptr);
                qf_gguf_writer_add_tensor(w, nm, t->type, t->n_dims, t->ne, t->data, t->nbytes, &e);
            }
            char out[512];
            snprintf(out, sizeof out, "%s/j.gguf", test_tmpdir());
            CHECK(qf_gguf_writer_write(w, out, &e) == QF_OK);
            qf_gguf_writer_free(w);
            qf_gguf_close(src);
            expect_refusal(out, QF_ERR_FORMAT, "softcapping");
        }
    }
    /* qwen2moe without its shared expert's down projection; shared experts on qwen3moe */
    expect_refusal(variant(FIX "qwen2moe.gguf", "k.gguf", NULL, 0, NULL, NULL, NULL, "blk.1.ffn_down_shexp.weight"),
                   QF_ERR_FORMAT, "blk.1.ffn_down_shexp.weight");
    expect_refusal(variant(FIX "qwen3moe.gguf", "l.gguf", "qwen3moe.expert_shared_count", 1, NULL, NULL, NULL, NULL),
                   QF_ERR_UNSUPPORTED, "shared experts");
    /* qk-norm family without its norm tensor */
    expect_refusal(variant(FIX "qwen3.gguf", "h.gguf", NULL, 0, NULL, NULL, NULL, "blk.2.attn_k_norm.weight"),
                   QF_ERR_FORMAT, "blk.2.attn_k_norm.weight");
}

/* ---- other tensor layouts of the same models (llama.cpp loads them too) ----
 * rewrite() copies a fixture with some tensors replaced by what split() writes instead; the
 * model must then give the fixture's logits (the same weights bound differently). */
typedef bool (*split_fn)(qf_gguf_writer *w, const char *name, const qf_gguf_tensor *t, qf_error *e);
static int split_dq, split_dkv; /* attn_qkv's q and k|v row counts (phi3) */

static const char *rewrite(const char *src_path, const char *name, split_fn split) {
    static char out[512];
    qf_error e = {0};
    qf_gguf *src = qf_gguf_open(src_path, &e);
    if (!src) return NULL;
    qf_gguf_writer *w = qf_gguf_writer_new();
    qf_status st = qf_gguf_writer_copy_kv(w, src, NULL, &e);
    for (uint64_t i = 0; !st && i < qf_gguf_n_tensors(src); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(src, i);
        char nm[128];
        snprintf(nm, sizeof nm, "%.*s", (int)t->name.len, t->name.ptr);
        if (!split(w, nm, t, &e)) st = qf_gguf_writer_add_tensor(w, nm, t->type, t->n_dims, t->ne, t->data, t->nbytes, &e);
    }
    snprintf(out, sizeof out, "%s/%s", test_tmpdir(), name);
    if (!st) st = qf_gguf_writer_write(w, out, &e);
    qf_gguf_writer_free(w);
    qf_gguf_close(src);
    return st ? NULL : out;
}

/* rows [r0, r0 + n) of a 2-D tensor as a tensor of its own */
static void add_rows(qf_gguf_writer *w, const char *name, const qf_gguf_tensor *t, int64_t r0, int64_t n, qf_error *e) {
    const size_t rb = qf_row_bytes(t->type, t->ne[0]);
    const int64_t ne[2] = {t->ne[0], n};
    qf_gguf_writer_add_tensor(w, name, t->type, 2, ne, (const uint8_t *)t->data + (size_t)r0 * rb, (uint64_t)n * rb, e);
}

/* phi3: blk.N.attn_qkv -> blk.N.attn_q, attn_k, attn_v */
static bool split_qkv(qf_gguf_writer *w, const char *name, const qf_gguf_tensor *t, qf_error *e) {
    int il;
    char tail[64];
    if (sscanf(name, "blk.%d.%63s", &il, tail) != 2 || strcmp(tail, "attn_qkv.weight") != 0) return false;
    char nm[96];
    snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", il), add_rows(w, nm, t, 0, split_dq, e);
    snprintf(nm, sizeof nm, "blk.%d.attn_k.weight", il), add_rows(w, nm, t, split_dq, split_dkv, e);
    snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", il), add_rows(w, nm, t, split_dq + split_dkv, split_dkv, e);
    return true;
}

/* mixtral: blk.N.ffn_{gate,up,down}_exps [ne0, ne1, E] -> the legacy blk.N.ffn_{gate,up,down}.X */
static bool split_exps(qf_gguf_writer *w, const char *name, const qf_gguf_tensor *t, qf_error *e) {
    int il;
    char kind[16];
    if (sscanf(name, "blk.%d.ffn_%15[a-z]_exps.weight", &il, kind) != 2 || t->n_dims != 3) return false;
    for (int64_t x = 0; x < t->ne[2]; x++) {
        char nm[96];
        snprintf(nm, sizeof nm, "blk.%d.ffn_%s.%lld.weight", il, kind, (long long)x);
        add_rows(w, nm, t, x * t->ne[1], t->ne[1], e);
    }
    return true;
}

/* the fixture fam and its rewritten copy give the same logits (and transformers' within the bar) */
static void same_logits(const char *fam, const char *path2) {
    CHECK_MSG(path2 != NULL, "%s: rewrite failed", fam);
    if (!path2) return;
    test_logits r;
    qf_model *m = load_fam(fam, &r);
    qf_error e = {0};
    qf_model *m2 = qf_model_load(path2, &e);
    CHECK_MSG(m && m2, "%s: %s", fam, e.msg);
    if (m && m2) {
        float *a = run(m, &r, false, r.n_tok, QF_KV_F32), *b = run(m2, &r, false, r.n_tok, QF_KV_F32);
        float *d = run(m2, &r, false, 1, QF_KV_F32); /* decode steps: the vec_dot route */
        CHECK(a && b && d);
        if (a && b && d) {
            double e_ab, t_ab, e_hf, t_hf, e_d, t_d;
            compare(b, a, r.n_tok, r.n_vocab, &e_ab, &t_ab);
            compare(b, r.logits, r.n_tok, r.n_vocab, &e_hf, &t_hf);
            compare(d, r.logits, r.n_tok, r.n_vocab, &e_d, &t_d);
            printf("  %-8s rewritten: vs the fixture nmse %.2e; vs transformers prefill %.2e top-1 %.0f%%, decode %.2e\n", fam,
                   e_ab, e_hf, 100 * t_hf, e_d);
            CHECK_MSG(e_ab == 0, "%s: the rewritten file's logits differ (nmse %g)", fam, e_ab);
            CHECK(e_hf <= 1e-5 && t_hf >= 0.99 && e_d <= 1e-5 && t_d >= 0.99);
        }
        free(a), free(b), free(d);
    }
    qf_model_free(m), qf_model_free(m2);
    test_free_logits(&r);
}

TEST(families_tensor_layouts) {
    FILE *probe = fopen(FIX "phi3.gguf", "rb");
    if (!probe) SKIP("tests/fixtures/families not found (run from the repository root)");
    fclose(probe);
    {
        qf_error e = {0};
        qf_model *m = qf_model_load(FIX "phi3.gguf", &e);
        CHECK(m != NULL);
        if (!m) return;
        const qf_hparams *hp = qf_model_hparams(m);
        split_dq = hp->n_head * hp->head_dim, split_dkv = hp->n_head_kv * hp->head_dim;
        CHECK(hp->fused_qkv);
        qf_model_free(m);
    }
    /* phi3 with separate attn_q / attn_k / attn_v */
    const char *p = rewrite(FIX "phi3.gguf", "phi3_sep.gguf", split_qkv);
    if (p) {
        qf_error e = {0};
        qf_model *m = qf_model_load(p, &e);
        CHECK_MSG(m && !qf_model_hparams(m)->fused_qkv && qf_model_hparams(m)->fused_gate_up, "%s", e.msg);
        qf_model_free(m);
    }
    same_logits("phi3", p);
    /* mixtral with the legacy 2-D expert tensors */
    same_logits("mixtral", rewrite(FIX "mixtral.gguf", "mixtral_2d.gguf", split_exps));
    /* a legacy expert missing is named */
    {
        const char *q = rewrite(FIX "mixtral.gguf", "mixtral_2d_b.gguf", split_exps);
        const char *q2 = q ? variant(q, "mixtral_2d_c.gguf", NULL, 0, NULL, NULL, NULL, "blk.1.ffn_up.3.weight") : NULL;
        expect_refusal(q2, QF_ERR_FORMAT, "blk.1.ffn_up.3.weight");
    }
}

int main(void) {
    RUN(families_match_transformers);
    RUN(families_decode_matches_prefill);
    RUN(families_quantized);
    RUN(families_awq_fold);
    RUN(families_swa_ring);
    RUN(families_prerope_k);
    RUN(families_hparams);
    RUN(families_refusals);
    RUN(families_tensor_layouts);
    return test_summary();
}
