/* test_awq.c: RTN re-quantization (qforge quantize) and the AWQ learner: round trip of an
 * RTN q4_0 model, folding invariance (scales folded, weights kept float: same logits), alpha 0
 * equals RTN byte for byte, the certificate rewrite, and clear errors for bad input. */
#include <stdlib.h>
#include <string.h>

#include "forge/awq_impl.h"
#include "format/quant_blocks.h"
#include "qforge/awq.h"
#include "qforge/gguf.h"
#include "qforge/model.h"
#include "qforge/ppl.h"
#include "test.h"
#include "util/util.h"

static char *read_head(const char *path, size_t cap, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(cap + 1);
    *len = fread(buf, 1, cap, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static int32_t *tokens_of(qf_model *m, const char *rel, size_t bytes, int64_t *n) {
    const char *p = test_data(rel);
    if (!p) return NULL;
    size_t len;
    char *text = read_head(p, bytes, &len);
    if (!text) return NULL;
    int32_t *ids = NULL;
    size_t nn = 0;
    qf_error e;
    qf_status st = qf_tokenize(qf_model_tokenizer(m), text, len, true, false, &ids, &nn, &e);
    free(text);
    if (st) return NULL;
    *n = (int64_t)nn;
    return ids;
}

static double ppl_of(const char *model_path, const int32_t *ids, int64_t n, int n_ctx) {
    qf_error e = {0};
    qf_model *m = qf_model_load(model_path, &e);
    if (!m) {
        fprintf(stderr, "  load %s: %s\n", model_path, e.msg);
        return NAN;
    }
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 2;
    cp.device = QF_DEVICE_CPU;
    qf_context *c = qf_context_new(m, &cp, &e);
    qf_ppl_params pp = qf_ppl_default_params();
    pp.n_ctx = n_ctx;
    qf_ppl_result r;
    double v = NAN;
    if (c && qf_perplexity(c, ids, n, &pp, &r, &e) == QF_OK) v = r.ppl;
    else fprintf(stderr, "  ppl: %s\n", e.msg);
    qf_context_free(c);
    qf_model_free(m);
    return v;
}

/* Logits of every position of `ids` (n tokens, one window). */
static float *logits_of(const char *model_path, const int32_t *ids, int n, int *n_vocab) {
    qf_error e = {0};
    qf_model *m = qf_model_load(model_path, &e);
    if (!m) {
        fprintf(stderr, "  load %s: %s\n", model_path, e.msg);
        return NULL;
    }
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = n;
    cp.n_threads = 2;
    cp.device = QF_DEVICE_CPU;
    cp.kv_k = cp.kv_v = QF_KV_F32;
    qf_context *c = qf_context_new(m, &cp, &e);
    *n_vocab = qf_model_hparams(m)->n_vocab;
    float *lg = malloc((size_t)n * (size_t)*n_vocab * sizeof(float));
    if (!c || qf_decode(c, ids, n, 0, lg, 0, &e) != QF_OK) {
        fprintf(stderr, "  decode: %s\n", e.msg);
        free(lg);
        lg = NULL;
    }
    qf_context_free(c);
    qf_model_free(m);
    return lg;
}

/* Tensor data of two files identical (by name)? Returns the number of tensors that differ. */
static int tensors_differ(const char *a_path, const char *b_path, bool verbose) {
    qf_error e = {0};
    qf_gguf *a = qf_gguf_open(a_path, &e), *b = qf_gguf_open(b_path, &e);
    int diff = 0;
    if (!a || !b) diff = 1000;
    for (uint64_t i = 0; a && b && i < qf_gguf_n_tensors(a); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(a, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const qf_gguf_tensor *u = qf_gguf_find_tensor(b, name);
        if (!u || u->type != t->type || u->nbytes != t->nbytes || memcmp(u->data, t->data, t->nbytes)) {
            if (verbose) fprintf(stderr, "  tensor %s differs\n", name);
            diff++;
        }
    }
    if (a && b && qf_gguf_n_tensors(a) != qf_gguf_n_tensors(b)) diff++;
    qf_gguf_close(a);
    qf_gguf_close(b);
    return diff;
}

/* test_data() and test_tmpdir() return static buffers: keep copies. */
static char g_dir[4096], g_model[4096];

static const char *model_path(const char *rel) {
    const char *p = test_data(rel);
    if (!p) return NULL;
    snprintf(g_model, sizeof g_model, "%s", p);
    snprintf(g_dir, sizeof g_dir, "%s", test_tmpdir());
    return g_model;
}

static char *tmp_path(const char *name) {
    static char buf[8][8200];
    static int k;
    char *p = buf[k++ % 8];
    if (!g_dir[0]) snprintf(g_dir, sizeof g_dir, "%s", test_tmpdir());
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

TEST(rtn_types_follow_llama_quantize) {
    int64_t ne2[2] = {384, 1024}, ne1[1] = {384}, ne_odd[2] = {172, 64};
    CHECK_EQ_INT(qf_quantize_tensor_type("blk.0.ffn_up.weight", 2, ne2, QF_TYPE_Q4_0, true), QF_TYPE_Q4_0);
    CHECK_EQ_INT(qf_quantize_tensor_type("blk.0.attn_norm.weight", 1, ne1, QF_TYPE_Q4_0, true), QF_TYPE_COUNT);
    CHECK_EQ_INT(qf_quantize_tensor_type("blk.0.attn_v.bias", 1, ne1, QF_TYPE_Q4_0, false), QF_TYPE_COUNT);
    CHECK_EQ_INT(qf_quantize_tensor_type("token_embd.weight", 2, ne2, QF_TYPE_Q4_0, true), QF_TYPE_Q8_0);
    CHECK_EQ_INT(qf_quantize_tensor_type("token_embd.weight", 2, ne2, QF_TYPE_Q4_0, false), QF_TYPE_Q4_0);
    CHECK_EQ_INT(qf_quantize_tensor_type("output.weight", 2, ne2, QF_TYPE_Q4_0, false), QF_TYPE_Q8_0);
    CHECK_EQ_INT(qf_quantize_tensor_type("output.weight", 2, ne2, QF_TYPE_F16, false), QF_TYPE_F16);
    CHECK_EQ_INT(qf_quantize_tensor_type("blk.0.ffn_down.weight", 2, ne_odd, QF_TYPE_Q4_0, false), QF_TYPE_F16);
}

TEST(rtn_round_trip_loads_and_ppl_close) {
    const char *mp = model_path("models/stories260K.gguf");
    if (!mp) SKIP("stories260K not in ../shared/data");
    qf_error e = {0};
    qf_model *m = qf_model_load(mp, &e);
    CHECK(m != NULL);
    if (!m) return;
    int64_t n = 0;
    int32_t *ids = tokens_of(m, "corpora/tinystories-valid-head.txt", 6000, &n);
    qf_model_free(m);
    if (!ids) SKIP("tinystories text not in ../shared/data");
    if (n > 512) n = 512;
    char *q4 = tmp_path("rtn-q4_0.gguf"), *q8 = tmp_path("rtn-q8_0.gguf");
    CHECK(qf_quantize_model(mp, q4, QF_TYPE_Q4_0, &e) == QF_OK);
    CHECK(qf_quantize_model(mp, q8, QF_TYPE_Q8_0, &e) == QF_OK);
    qf_gguf *g = qf_gguf_open(q4, &e);
    CHECK(g != NULL);
    if (g) {
        uint32_t ft = 0;
        CHECK(qf_gguf_get_u32(g, "general.file_type", &ft) && ft == 2);
        CHECK_EQ_INT(qf_gguf_find_tensor(g, "blk.0.attn_q.weight")->type, QF_TYPE_Q4_0);
        CHECK_EQ_INT(qf_gguf_find_tensor(g, "blk.0.ffn_down.weight")->type, QF_TYPE_F16); /* 172 */
        CHECK_EQ_INT(qf_gguf_find_tensor(g, "blk.0.attn_norm.weight")->type, QF_TYPE_F32);
        CHECK_EQ_INT(qf_gguf_find_tensor(g, "output.weight")->type, QF_TYPE_Q8_0);
        qf_gguf_close(g);
    }
    double p_ref = ppl_of(mp, ids, n, 128), p4 = ppl_of(q4, ids, n, 128), p8 = ppl_of(q8, ids, n, 128);
    printf("  stories260K PPL: f32 %.4f, q8_0 %.4f, q4_0 %.4f\n", p_ref, p8, p4);
    CHECK(isfinite(p4) && isfinite(p8));
    CHECK(fabs(p8 / p_ref - 1) < 0.01);
    CHECK(p4 > p_ref * 0.98 && p4 < p_ref * 1.5);
    free(ids);
}

/* AWQ with the given params on a model; returns its status. */
static qf_status awq_on(const char *mp, const char *rel, qf_awq_params *p, const char *out,
                        qf_awq_report *rep, qf_error *e) {
    qf_model *m = qf_model_load(mp, e);
    if (!m) return e->code;
    int64_t n = 0;
    int32_t *ids = tokens_of(m, rel, 8000, &n);
    qf_status st = ids ? qf_awq_run(m, ids, n, p, out, rep, e) : QF_ERR_IO;
    free(ids);
    qf_model_free(m);
    return st;
}

static void check_invariance(const char *mp, const char *rel, float alpha) {
    qf_error e = {0};
    qf_awq_params p = qf_awq_default_params();
    p.keep_float = true;
    p.clip = false;
    p.fixed_alpha = alpha;
    p.rows_per_site = 64;
    p.max_tokens = 256;
    p.n_ctx = 128;
    p.n_threads = 2;
    qf_awq_report rep;
    char *out = tmp_path("folded.gguf");
    CHECK(awq_on(mp, rel, &p, out, &rep, &e) == QF_OK);
    if (e.code) fprintf(stderr, "  %s\n", e.msg);
    int scaled = 0;
    for (int i = 0; i < rep.n_layer * QF_AWQ_GROUP_COUNT; i++) scaled += rep.alpha[i] > 0;
    CHECK(scaled >= rep.n_layer); /* at least one group per layer really scaled */
    /* GQA: v -> o is folded with one scale per kv-head channel (attn_v rows, and every query
     * head's wo columns of that group): checked by the logits below */
    for (int l = 0; l < rep.n_layer; l++) CHECK(rep.alpha[l * QF_AWQ_GROUP_COUNT + QF_AWQ_VO] == alpha);
    qf_awq_report_free(&rep);
    /* the fold changed the tensors ... */
    CHECK(tensors_differ(mp, out, false) > 0);
    /* ... but not the function */
    qf_model *m = qf_model_load(mp, &e);
    int64_t n = 0;
    int32_t *ids = m ? tokens_of(m, rel, 2000, &n) : NULL;
    qf_model_free(m);
    CHECK(ids != NULL);
    if (!ids) return;
    if (n > 64) n = 64;
    int nv = 0, nv2 = 0;
    float *a = logits_of(mp, ids, (int)n, &nv), *b = logits_of(out, ids, (int)n, &nv2);
    CHECK(a && b && nv == nv2);
    if (a && b) {
        double md = 0, ma = 0;
        for (int64_t i = 0; i < n * nv; i++) {
            md = fmax(md, fabs((double)a[i] - (double)b[i]));
            ma = fmax(ma, fabs((double)a[i]));
        }
        printf("  alpha %.2f folded vs original logits: max |diff| %.3e (max |logit| %.2f)\n", (double)alpha, md, ma);
        CHECK(md <= 1e-4 * (ma > 1 ? ma : 1) * 10);
    }
    free(a);
    free(b);
    free(ids);
}

/* Folding must not change the function whatever the weights: without ../shared (a fresh clone)
 * the check runs on the random-weight fixture of the same shape (tests/helpers/make_fixtures.sh)
 * with the demo corpus as calibration text. */
static void invariance_or_fixture(const char *model, const char *fixture, float alpha) {
    const char *mp = model_path(model), *rel = "corpora/tinystories-valid-head.txt";
    if (!mp || !test_data(rel)) {
        mp = model_path(fixture);
        rel = "corpora/kerneldoc-demo/docs.txt";
    }
    if (!mp || !test_data(rel)) {
        qf_test_skip_reason = "the model / tinystories (or the fixture) not in ../shared/data";
        return;
    }
    check_invariance(mp, rel, alpha);
}

TEST(folding_keeps_the_function_llama) {
    invariance_or_fixture("models/stories260K.gguf", "models/synthetic-hd8-f32.gguf", 0.5f);
}

TEST(folding_keeps_the_function_qwen2_biases) {
    invariance_or_fixture("models/qforge-demo-qwen2-5m-f16.gguf", "models/synthetic-qwen2-f16.gguf", 0.7f);
}

TEST(alpha_zero_equals_rtn) {
    const char *mp = model_path("models/stories260K.gguf");
    if (!mp || !test_data("corpora/tinystories-valid-head.txt")) SKIP("stories260K / tinystories not in ../shared/data");
    qf_error e = {0};
    qf_awq_params p = qf_awq_default_params();
    p.clip = false;
    p.fixed_alpha = 0;
    p.rows_per_site = 32;
    p.max_tokens = 128;
    p.n_ctx = 128;
    p.n_threads = 2;
    char *rtn = tmp_path("a0-rtn.gguf"), *awq = tmp_path("a0-awq.gguf");
    CHECK(qf_quantize_model(mp, rtn, QF_TYPE_Q4_0, &e) == QF_OK);
    CHECK(awq_on(mp, "corpora/tinystories-valid-head.txt", &p, awq, NULL, &e) == QF_OK);
    CHECK_EQ_INT(tensors_differ(rtn, awq, true), 0);
}

TEST(awq_search_and_certificate) {
    const char *mp = model_path("models/stories260K.gguf");
    if (!mp || !test_data("corpora/tinystories-valid-head.txt")) SKIP("stories260K / tinystories not in ../shared/data");
    qf_error e = {0};
    qf_awq_params p = qf_awq_default_params();
    p.rows_per_site = 128;
    p.max_tokens = 1024;
    p.n_ctx = 128;
    p.n_threads = 2;
    qf_awq_report rep;
    char *out = tmp_path("awq.gguf");
    CHECK(awq_on(mp, "corpora/tinystories-valid-head.txt", &p, out, &rep, &e) == QF_OK);
    if (e.code) fprintf(stderr, "  %s\n", e.msg);
    CHECK_EQ_INT(rep.n_layer, 5);
    CHECK(!rep.vo_skipped_gqa); /* 8 heads / 4 kv heads: v -> o tied per kv head */
    for (int l = 0; l < rep.n_layer; l++) {
        float *a = rep.alpha + l * QF_AWQ_GROUP_COUNT;
        CHECK(a[QF_AWQ_QKV] >= 0 && a[QF_AWQ_QKV] < 1);
        CHECK(a[QF_AWQ_GATE_UP] >= 0 && a[QF_AWQ_GATE_UP] < 1);
        CHECK(a[QF_AWQ_DOWN] < 0); /* ffn_down rows of 172: not Q4_0, not scaled */
        CHECK(a[QF_AWQ_VO] >= 0 && a[QF_AWQ_VO] < 1); /* wo rows of 64 */
        /* alpha 0 is a candidate and the block quantizer never loses to RTN on its metric */
        CHECK(rep.mse_awq[l * QF_AWQ_GROUP_COUNT] <= rep.mse_rtn[l * QF_AWQ_GROUP_COUNT] * 1.0001);
        CHECK(rep.mse_awq[l * QF_AWQ_GROUP_COUNT + QF_AWQ_VO] <= rep.mse_rtn[l * QF_AWQ_GROUP_COUNT + QF_AWQ_VO] * 1.0001);
    }
    uint8_t sha[32];
    /* certificate rewrite: keys added, tensors unchanged, sha of the new file */
    char *copy = tmp_path("awq-cert.gguf");
    {
        qf_gguf *g = qf_gguf_open(out, &e);
        size_t sz;
        const uint8_t *d = g ? qf_gguf_file_data(g, &sz) : NULL;
        FILE *f = fopen(copy, "wb");
        CHECK(d && f && fwrite(d, 1, sz, f) == sz);
        if (f) fclose(f);
        qf_gguf_close(g);
    }
    qf_certificate cert;
    qf_certificate_init(&cert, QF_ARTIFACT_AWQ);
    cert.ref_ppl = 10.0;
    cert.cand_ppl = 10.5;
    cert.delta_ppl = 0.05;
    cert.passed = true;
    snprintf(cert.split, sizeof cert.split, "test");
    CHECK(qf_awq_embed_certificate(copy, &cert, &rep, sha, &e) == QF_OK);
    if (e.code) fprintf(stderr, "  %s\n", e.msg);
    CHECK_EQ_INT(tensors_differ(out, copy, true), 0);
    uint8_t sha2[32];
    CHECK(qf_sha256_file(copy, sha2, &e) == QF_OK && memcmp(sha, sha2, 32) == 0);
    qf_gguf *g = qf_gguf_open(copy, &e);
    CHECK(g != NULL);
    if (g) {
        float v = 0;
        bool passed = false;
        char buf[256];
        CHECK(qf_gguf_get_f32(g, "qforge.cand_ppl", &v) && fabsf(v - 10.5f) < 1e-5f);
        CHECK(qf_gguf_get_bool(g, "qforge.passed", &passed) && passed);
        CHECK(qf_gguf_get_str(g, "qforge.kind", buf, sizeof buf) && !strcmp(buf, "awq"));
        CHECK(qf_gguf_get_str(g, "qforge.awq.tensor_sha256", buf, sizeof buf) && !strcmp(buf, rep.tensor_sha256_hex));
        CHECK(qf_gguf_get_str(g, "qforge.awq.alpha", buf, sizeof buf) && strchr(buf, ';'));
        qf_gguf_close(g);
    }
    qf_certificate_free(&cert);
    qf_awq_report_free(&rep);
    /* the AWQ model runs */
    qf_model *m = qf_model_load(mp, &e);
    int64_t n = 0;
    int32_t *ids = m ? tokens_of(m, "corpora/tinystories-valid-head.txt", 6000, &n) : NULL;
    qf_model_free(m);
    if (ids) {
        if (n > 512) n = 512;
        double pr = ppl_of(mp, ids, n, 128), pa = ppl_of(copy, ids, n, 128);
        printf("  stories260K PPL: f32 %.4f, awq-q4_0 %.4f\n", pr, pa);
        CHECK(isfinite(pa) && pa < pr * 1.5);
    }
    free(ids);
}

/* the non-default scoring options run and stay sane (gate/up on the FFN block output, duo) */
TEST(awq_options_act_loss_duo) {
    const char *mp = model_path("models/qforge-demo-qwen2-5m-f16.gguf");
    if (!mp || !test_data("corpora/tinystories-valid-head.txt")) SKIP("qwen2-5m / tinystories not in ../shared/data");
    qf_error e = {0};
    qf_awq_params p = qf_awq_default_params();
    p.ffn_act_loss = true;
    p.duo = true;
    p.rows_per_site = 64;
    p.max_tokens = 256;
    p.n_ctx = 128;
    p.n_grid = 5;
    p.n_threads = 2;
    qf_awq_report rep;
    CHECK(awq_on(mp, "corpora/tinystories-valid-head.txt", &p, tmp_path("awq-opt.gguf"), &rep, &e) == QF_OK);
    if (e.code) fprintf(stderr, "  %s\n", e.msg);
    for (int i = 0; i < rep.n_layer * QF_AWQ_GROUP_COUNT; i++) {
        CHECK(rep.alpha[i] >= 0 && rep.alpha[i] < 1);
        CHECK(rep.mse_awq[i] <= rep.mse_rtn[i] * 1.0001);
    }
    qf_awq_report_free(&rep);
}

TEST(bad_input_is_a_clear_error) {
    qf_error e = {0};
    char *out = tmp_path("bad.gguf");
    CHECK_EQ_INT(qf_quantize_model("/nonexistent/model.gguf", out, QF_TYPE_Q4_0, &e), QF_ERR_IO);
    CHECK(strstr(e.msg, "/nonexistent/model.gguf") != NULL);
    const char *mp = model_path("models/stories260K.gguf");
    if (mp) {
        CHECK_EQ_INT(qf_quantize_model(mp, out, QF_TYPE_Q4_K, &e), QF_ERR_ARG);
        CHECK(strstr(e.msg, "q4_0") != NULL);
    }
    const char *bert = test_data("vocab/ggml-vocab-bert-bge.gguf");
    if (bert) {
        CHECK_EQ_INT(qf_quantize_model(bert, out, QF_TYPE_Q4_0, &e), QF_ERR_UNSUPPORTED);
        CHECK(strstr(e.msg, "bert") != NULL && strstr(e.msg, "llama") != NULL);
    }
    if (mp) {
        qf_model *m = qf_model_load(mp, &e);
        int32_t one = 1;
        qf_awq_params p = qf_awq_default_params();
        CHECK_EQ_INT(qf_awq_run(m, &one, 1, &p, out, NULL, &e), QF_ERR_ARG);
        p.n_grid = 0;
        int32_t two[2] = {1, 2};
        CHECK_EQ_INT(qf_awq_run(m, two, 2, &p, out, NULL, &e), QF_ERR_ARG);
        CHECK(strstr(e.msg, "n_grid") != NULL);
        if (!qf_cuda_available()) { /* --device cuda without a GPU: refused before any work */
            p = qf_awq_default_params();
            p.device = QF_DEVICE_CUDA;
            CHECK_EQ_INT(qf_awq_run(m, two, 2, &p, out, NULL, &e), QF_ERR_DEVICE);
            CHECK(strstr(e.msg, "--device cpu") != NULL);
        }
        qf_model_free(m);
    }
    FILE *f = fopen(out, "rb");
    CHECK(f == NULL); /* nothing written */
    if (f) fclose(f);
    /* the CLI: wrong type name */
    const char *cli = test_cli();
    if (cli && mp) {
        char cmd[8800];
        snprintf(cmd, sizeof cmd, "%s quantize %s %s q5_q 2>&1", cli, mp, out);
        FILE *pp = popen(cmd, "r");
        char buf[1024] = {0};
        size_t len = pp ? fread(buf, 1, sizeof buf - 1, pp) : 0;
        int rc = pp ? pclose(pp) : -1;
        buf[len] = 0;
        CHECK(rc != 0);
        CHECK(strstr(buf, "q5_q") && strstr(buf, "q4_0"));
    }
}

/* qf_awq_quant_rows, the CPU oracle test_cuda holds the GPU's block quantizer to: RTN is
 * quant.c's Q4_0 byte for byte; a search ratio of exactly 1 is RTN's block, any other is a
 * block whose error under its importance is no larger than RTN's; deq is the dequantized block
 * divided by s. Runs everywhere (no GPU needed). */
TEST(quant_rows_oracle) {
    const int64_t R = 24, D = 256, nb = D / 32;
    float *W = malloc((size_t)(R * D) * 4), *s = malloc((size_t)D * 4), *imp = malloc((size_t)D * 4);
    float *cov = malloc((size_t)D * 32 * 4), *deq = malloc((size_t)(R * D) * 4), *x = malloc((size_t)D * 4);
    float *rat = malloc((size_t)(R * nb) * 4), *dq = malloc((size_t)D * 4);
    block_q4_0 *q = malloc((size_t)(R * nb) * sizeof(block_q4_0)), *ref = malloc((size_t)nb * sizeof(block_q4_0));
    uint64_t st = 7;
    for (int64_t i = 0; i < R * D; i++) W[i] = ((float)qf_rand_unit(&st) - 0.5f) * 0.05f * (i % 29 == 0 ? 6 : 1);
    for (int64_t c = 0; c < D; c++) s[c] = 0.5f + 2 * (float)qf_rand_unit(&st), imp[c] = 0.01f + (float)qf_rand_unit(&st);
    for (int64_t b = 0; b < nb; b++) /* diagonal covariances: the two searches see the same metric */
        for (int i = 0; i < 32; i++)
            for (int j = 0; j < 32; j++) cov[b * 1024 + i * 32 + j] = i == j ? imp[b * 32 + i] : 0;
    int64_t bad_rtn = 0, bad_deq = 0, worse = 0, moved = 0;
    for (int quant = 0; quant < 3; quant++) {
        CHECK_EQ_INT(qf_awq_quant_rows(W, R, D, s, quant, imp, cov, q, rat, deq), QF_OK);
        for (int64_t r = 0; r < R; r++) {
            for (int64_t c = 0; c < D; c++) x[c] = W[r * D + c] * s[c];
            qf_quantize_row(QF_TYPE_Q4_0, x, ref, D);
            qf_dequantize_row(QF_TYPE_Q4_0, q + r * nb, dq, D);
            for (int64_t c = 0; c < D; c++) bad_deq += deq[r * D + c] != dq[c] / s[c];
            for (int64_t b = 0; b < nb; b++) {
                const block_q4_0 *got = &q[r * nb + b];
                bool same = memcmp(got, &ref[b], sizeof *got) == 0;
                if (quant == 0 || rat[r * nb + b] == 1.0f) {
                    bad_rtn += !same;
                    continue;
                }
                moved++;
                float dr[32];
                qf_dequantize_row(QF_TYPE_Q4_0, &ref[b], dr, 32);
                double eg = 0, er = 0;
                for (int i = 0; i < 32; i++) {
                    double a = x[b * 32 + i] - dq[b * 32 + i], e = x[b * 32 + i] - dr[i];
                    eg += imp[b * 32 + i] * a * a, er += imp[b * 32 + i] * e * e;
                }
                worse += eg > er * (1 + 1e-6);
            }
        }
    }
    printf("  %lld searched blocks off RTN, %lld RTN mismatches, %lld worse than RTN, %lld deq mismatches\n",
           (long long)moved, (long long)bad_rtn, (long long)worse, (long long)bad_deq);
    CHECK(moved > 0);
    CHECK_EQ_INT(bad_rtn, 0);
    CHECK_EQ_INT(worse, 0);
    CHECK_EQ_INT(bad_deq, 0);
    free(W), free(s), free(imp), free(cov), free(deq), free(x), free(rat), free(dq), free(q), free(ref);
}

int main(void) {
    RUN(rtn_types_follow_llama_quantize);
    RUN(rtn_round_trip_loads_and_ppl_close);
    RUN(folding_keeps_the_function_llama);
    RUN(folding_keeps_the_function_qwen2_biases);
    RUN(alpha_zero_equals_rtn);
    RUN(awq_search_and_certificate);
    RUN(awq_options_act_loss_duo);
    RUN(bad_input_is_a_clear_error);
    RUN(quant_rows_oracle);
    return test_summary();
}
