/* test_pipeline.c: the forge pipeline end to end on the demo model (small settings): kv-int8
 * calibrate -> package -> load -> ppl reproduces the certificate's PPL; a failed gate writes
 * nothing and answers CertifyFailed; an artifact is refused on another model (f16 vs q8_0);
 * certification leaves the context as it found it; the engine's dict cache (OMP on write,
 * decode on read) reconstructs as well as the forge's batch encoder. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "engine/kv_codes.h"
#include "qforge/artifact_bind.h"
#include "qforge/capture.h"
#include "qforge/forge.h"
#include "qforge/ppl.h"
#include "test.h"
#include "util/util.h"

#define NCTX 128
#define EVAL_CHUNKS 4

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* test_data() returns a static buffer: keep copies */
static const char *data(const char *rel, char *buf, size_t cap) {
    const char *p = test_data(rel);
    if (!p) return NULL;
    snprintf(buf, cap, "%s", p);
    return buf;
}
static char b_model[4096], b_corpus[4096], b_q8[4096];
#define MODEL() data("models/qforge-demo-11m-f16.gguf", b_model, sizeof b_model)
#define CORPUS() data("corpora/kerneldoc-demo/docs.txt", b_corpus, sizeof b_corpus)

static void small_job(qf_job *j, const char *model, const char **corpus, qf_artifact_kind kind) {
    qf_job_default(j);
    j->model_path = model;
    j->kind = kind;
    j->corpus_paths = corpus;
    j->n_corpus_paths = 1;
    j->n_ctx = NCTX;
    j->max_calib_tokens = 2048;
    j->eval_chunks = EVAL_CHUNKS;
    j->n_threads = 2;
    j->dict_atoms = 32;
    j->dict_sparsity = 4;
    j->dict_iters = 2;
    j->dict_max_train = 1024;
    /* tiny runs (2048 calibration tokens, 2 chunks of 128): the baseline comparison is tested in
     * test_gate.c and cli_calibrate.sh at sizes where it means something */
    j->gate.vs_baseline = false;
}

/* one kv-int8 job shared by the tests that need a certified artifact */
static char g_art[4096], g_eval[4096];
static bool g_done, g_ok;
static qf_certificate g_cert;

static bool int8_artifact(void) {
    if (g_done) return g_ok;
    g_done = true;
    const char *mp = MODEL(), *cp = CORPUS();
    if (!mp || !cp) return false;
    const char *paths[1] = {cp};
    snprintf(g_art, sizeof g_art, "%s/int8.qfa", test_tmpdir());
    snprintf(g_eval, sizeof g_eval, "%s/eval.txt", test_tmpdir());
    qf_job j;
    small_job(&j, mp, paths, QF_ARTIFACT_KV_INT8);
    j.out_path = g_art;
    j.eval_out_path = g_eval;
    qf_job_report rep;
    qf_error e = {0};
    qf_status st = qf_job_run(&j, &rep, &e);
    CHECK_MSG(st == QF_OK, "%s", e.msg);
    CHECK(rep.packaged);
    CHECK_EQ_INT(rep.n_tried, 3);
    printf("  kv-int8 %s: ref %.4f cand %.4f delta %+.4f%% +/- %.4f%% kld %.6f top1 %.4f; %s kld %.6f; %s kld %.6f\n",
           rep.variant, rep.result.ref_ppl, rep.result.cand_ppl, 100 * rep.result.delta_ppl,
           100 * rep.result.delta_ppl_err, rep.result.kld_mean, rep.result.top1, rep.tried[1].variant,
           rep.tried[1].result.kld_mean, rep.tried[2].variant, rep.tried[2].result.kld_mean);
    /* the rotated per-row layouts have no static range to clip; the entropy-coded one has the
     * finer step: it wins on KLD */
    CHECK(!strcmp(rep.variant, "ec-rot"));
    CHECK(!strcmp(rep.tried[1].variant, "token-rot") && !strcmp(rep.tried[2].variant, "per-channel"));
    CHECK(rep.result.kld_mean < rep.tried[1].result.kld_mean && rep.result.kld_mean < rep.tried[2].result.kld_mean);
    /* the paired per-chunk standard error of delta PPL is measured (several chunks) */
    CHECK(rep.result.n_chunks > 1 && rep.result.delta_ppl_err > 0 && isfinite(rep.result.delta_ppl_err));
    g_cert = rep.cert;
    memset(&rep.cert.config, 0, sizeof rep.cert.config); /* keep nothing that needs freeing */
    qf_certificate_free(&g_cert);
    qf_job_report_free(&rep);
    g_ok = st == QF_OK;
    return g_ok;
}

TEST(int8_calibrate_package_load_ppl_reproduces) {
    if (!int8_artifact()) SKIP("demo model or kerneldoc corpus not in ../shared/data");
    qf_error e = {0};
    qf_model *m = qf_model_load(MODEL(), &e);
    if (!m) SKIP("demo model did not load");
    qf_artifact a;
    CHECK_MSG(qf_artifact_load(g_art, qf_model_sha256(m), NULL, &a, &e) == QF_OK, "%s", e.msg);
    CHECK(a.cert.kind == QF_ARTIFACT_KV_INT8);
    CHECK(a.cert.delta_ppl < 0.001); /* the target: within 0.1% of f32 KV */
    int64_t chunks = 0, nctx = 0;
    const char *sha = NULL;
    CHECK(qf_payload_get_int(&a.cert.config, "eval_chunks", &chunks) && chunks == EVAL_CHUNKS);
    CHECK(qf_payload_get_int(&a.cert.config, "eval_n_ctx", &nctx) && nctx == NCTX);
    CHECK((sha = qf_payload_get_string(&a.cert.config, "eval_text_sha256")) != NULL);
    const char *arith = qf_payload_get_string(&a.cert.config, "arith");
    CHECK(arith && !strcmp(arith, "canonical")); /* kv-int8 on a llama model: covered */
    /* what qforge ppl --artifact does (the canonical arithmetic, as certification) */
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = NCTX;
    cp.n_threads = 2;
    cp.canonical = true;
    cp.device = QF_DEVICE_CPU;
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK(c != NULL);
    CHECK_MSG(qf_context_bind_artifact(c, &a, &e) == QF_OK, "%s", e.msg);
    CHECK(qf_context_params_get(c)->kv_k == QF_KV_INT8);
    CHECK_NEAR(qf_context_kv_bytes_per_token(c), 6.0 * 2 * 64 * 2, 0); /* 6 layers, 2 kv heads, 64, K+V */
    char *text;
    size_t len;
    CHECK(qf_read_file(g_eval, &text, &len, &e) == QF_OK);
    uint8_t h[32];
    char hex[65];
    qf_sha256(text, len, h);
    qf_hex(h, 32, hex);
    CHECK(sha && strcmp(sha, hex) == 0);
    qf_ppl_params pp = qf_ppl_default_params();
    pp.n_ctx = NCTX;
    pp.n_chunks = EVAL_CHUNKS;
    qf_ppl_result r;
    CHECK(qf_perplexity_text(c, text, len, &pp, &r, &e) == QF_OK);
    printf("  rerun PPL %.6f, certificate %.6f\n", r.ppl, a.cert.cand_ppl);
    CHECK_NEAR(r.ppl, a.cert.cand_ppl, 1e-9 * a.cert.cand_ppl);
    free(text);
    qf_context_free(c);
    qf_artifact_free(&a);
    qf_model_free(m);
}

TEST(artifact_refused_on_another_model) {
    if (!int8_artifact()) SKIP("demo model or kerneldoc corpus not in ../shared/data");
    const char *q8 = data("models/qforge-demo-11m-q8_0.gguf", b_q8, sizeof b_q8);
    if (!q8) SKIP("qforge-demo-11m-q8_0.gguf not in ../shared/data");
    qf_error e = {0};
    qf_model *m = qf_model_load(q8, &e);
    if (!m) SKIP("q8_0 model did not load");
    qf_artifact a;
    CHECK_EQ_INT(qf_artifact_load(g_art, qf_model_sha256(m), NULL, &a, &e), QF_ERR_ARTIFACT_WRONG_MODEL);
    /* the binding checks again: an artifact read without a model is still refused there */
    CHECK(qf_artifact_load(g_art, NULL, NULL, &a, &e) == QF_OK);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 2;
    cp.device = QF_DEVICE_CPU;
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK(c != NULL);
    CHECK_EQ_INT(qf_context_bind_artifact(c, &a, &e), QF_ERR_ARTIFACT_WRONG_MODEL);
    CHECK(!qf_context_bound(c, NULL));
    CHECK(qf_context_params_get(c)->kv_k == QF_KV_F16);
    qf_artifact_free(&a);
    qf_context_free(c);
    qf_model_free(m);
}

TEST(failed_gate_writes_nothing) {
    const char *mp = MODEL(), *cp = CORPUS();
    if (!mp || !cp) SKIP("demo model or kerneldoc corpus not in ../shared/data");
    const char *paths[1] = {cp};
    char out[4096];
    snprintf(out, sizeof out, "%s/dict.qfa", test_tmpdir());
    qf_job j;
    small_job(&j, mp, paths, QF_ARTIFACT_KV_DICT);
    j.gate.max_delta_ppl = 0;
    j.eval_chunks = 2;
    j.max_calib_tokens = 512;
    j.out_path = out;
    qf_job_report rep;
    qf_error e = {0};
    CHECK_EQ_INT(qf_job_run(&j, &rep, &e), QF_ERR_CERTIFY_FAILED);
    printf("  %s\n", e.msg);
    CHECK(strstr(e.msg, "did not pass its gate") != NULL);
    CHECK(!rep.packaged && !rep.result.passed && rep.result.delta_ppl > 0);
    CHECK(rep.result.cand_kv_bytes_per_token < rep.f16_kv_bytes_per_token);
    CHECK(!exists(out));
    qf_job_report_free(&rep);
    /* an empty corpus, a missing file */
    char empty[4096];
    snprintf(empty, sizeof empty, "%s/empty.txt", test_tmpdir());
    FILE *f = fopen(empty, "w");
    fputs("  \n\n", f);
    fclose(f);
    const char *ep[1] = {empty};
    j.corpus_paths = ep;
    CHECK_EQ_INT(qf_job_run(&j, &rep, &e), QF_ERR_CORPUS_EMPTY);
    qf_job_report_free(&rep);
    j.kind = (qf_artifact_kind)7; /* not a kind */
    j.corpus_paths = paths;
    CHECK_EQ_INT(qf_job_run(&j, &rep, &e), QF_ERR_ARG);
    qf_job_report_free(&rep);
    CHECK(!exists(out));
}

/* Run a kv-dict job on 512 calibration tokens with gates nothing fails and load what it wrote
 * to j->out_path into *a (false, with a failed check, when either step fails). */
static bool run_loose_dict(qf_job *j, qf_artifact *a) {
    j->gate.max_delta_ppl = 1e6, j->gate.has_max_kld = true, j->gate.max_kld = 1e6;
    j->gate.has_max_kld_p99 = true, j->gate.max_kld_p99 = 1e6, j->gate.vs_baseline = false;
    j->max_calib_tokens = 512;
    qf_job_report rep;
    qf_error e = {0};
    qf_status st = qf_job_run(j, &rep, &e);
    qf_job_report_free(&rep);
    CHECK_MSG(st == QF_OK, "%s", e.msg);
    if (st) return false;
    st = qf_artifact_load(j->out_path, NULL, NULL, a, &e);
    CHECK_MSG(st == QF_OK, "%s", e.msg);
    return st == QF_OK;
}

/* a kv-dict certificate says its numbers are this device's (arith "device"): the reference pass
 * is canonical, the dictionary's OMP codes are not (pipeline.c) */
TEST(dict_certificate_arith_is_device) {
    const char *mp = MODEL(), *cp = CORPUS();
    if (!mp || !cp) SKIP("demo model or kerneldoc corpus not in ../shared/data");
    const char *paths[1] = {cp};
    char out[4096];
    snprintf(out, sizeof out, "%s/dict_arith.qfa", test_tmpdir());
    qf_job j;
    small_job(&j, mp, paths, QF_ARTIFACT_KV_DICT);
    j.dict_atoms = 64, j.dict_sparsity = 8, j.dict_iters = 1;
    j.eval_chunks = 2;
    j.out_path = out;
    qf_artifact a;
    if (!run_loose_dict(&j, &a)) return;
    const char *arith = qf_payload_get_string(&a.cert.config, "arith");
    CHECK(arith && !strcmp(arith, "device"));
    qf_artifact_free(&a);
}

/* kv-dict's dictionaries are learned side by side (pipeline.c learn_dict): the payload is the
 * same bytes with 1 thread (one after another), 2 (two at a time) and 3 (three at a time, on
 * 10 dictionaries: uneven shares), error-bounded v2 included */
TEST(dict_payload_independent_of_threads) {
    const char *mp = MODEL(), *cp = CORPUS();
    if (!mp || !cp) SKIP("demo model or kerneldoc corpus not in ../shared/data");
    const char *paths[1] = {cp};
    uint8_t sha[3][32];
    for (int t = 0; t < 3; t++) {
        char out[4096];
        snprintf(out, sizeof out, "%s/dict_t%d.qfa", test_tmpdir(), t + 1);
        qf_job j;
        small_job(&j, mp, paths, QF_ARTIFACT_KV_DICT);
        j.dict_version = 2, j.dict_tol_quantile = 0.5;
        j.eval_chunks = 1;
        j.n_threads = t + 1;
        j.out_path = out;
        qf_artifact a;
        if (!run_loose_dict(&j, &a)) return;
        memcpy(sha[t], a.cert.payload_sha256, 32);
        size_t nk = 0;
        CHECK(qf_payload_get_f32(&a.payload, "k_tol", &nk) && nk > 0);
        qf_artifact_free(&a);
    }
    CHECK(!memcmp(sha[0], sha[1], 32));
    CHECK(!memcmp(sha[0], sha[2], 32));
}

TEST(certify_restores_the_context) {
    const char *mp = MODEL(), *cpath = CORPUS();
    if (!mp || !cpath) SKIP("demo model or kerneldoc corpus not in ../shared/data");
    qf_error e = {0};
    qf_model *m = qf_model_load(mp, &e);
    if (!m) SKIP("demo model did not load");
    const qf_hparams *hp = qf_model_hparams(m);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = NCTX;
    cp.n_threads = 2;
    cp.device = QF_DEVICE_CPU; /* kv f16, the default */
    qf_context *c = qf_context_new(m, &cp, &e);
    char *text;
    size_t len;
    CHECK(qf_read_file(cpath, &text, &len, &e) == QF_OK);
    if (len > 40000) len = 40000;
    double bpt = qf_context_kv_bytes_per_token(c);
    qf_certify_params p = {.n_ctx = NCTX, .n_chunks = 2};
    qf_certify_ref *ref = NULL;
    CHECK(qf_certify_reference(c, text, len, &p, &ref, &e) == QF_OK);
    /* a dictionary of random unit atoms: certifiable, bad */
    qf_payload pl = {0};
    int na = 16;
    float *atoms = malloc((size_t)na * hp->head_dim * sizeof(float));
    uint64_t s = 12345;
    for (int i = 0; i < na * hp->head_dim; i++) {
        atoms[i] = (float)qf_rand_unit(&s) - 0.5f;
    }
    qf_payload_add_int(&pl, "n_atoms", na, &e);
    qf_payload_add_int(&pl, "sparsity", 2, &e);
    qf_payload_add_string(&pl, "coef", "f16", &e);
    for (int l = 0; l < hp->n_layer; l++) {
        char nk[16], nv[16];
        snprintf(nk, sizeof nk, "k.%d", l);
        snprintf(nv, sizeof nv, "v.%d", l);
        int64_t shape[2] = {na, hp->head_dim};
        qf_payload_add_f32(&pl, nk, atoms, 2, shape, &e);
        if (l > 0) qf_payload_add_f32(&pl, nv, atoms, 2, shape, &e); /* v.0 missing */
    }
    qf_gate g = qf_gate_default();
    qf_certify_result r;
    /* a payload that cannot bind: CertifyFailed, context untouched */
    CHECK_EQ_INT(qf_certify_candidate(c, ref, QF_ARTIFACT_KV_DICT, &pl, &g, &r, &e), QF_ERR_CERTIFY_FAILED);
    CHECK(strstr(e.msg, "v.0") != NULL);
    CHECK(!qf_context_bound(c, NULL) && qf_context_params_get(c)->kv_k == QF_KV_F16 &&
          qf_context_params_get(c)->kv_v == QF_KV_F16 && qf_context_kv_bytes_per_token(c) == bpt);
    int64_t shape[2] = {na, hp->head_dim};
    qf_payload_add_f32(&pl, "v.0", atoms, 2, shape, &e);
    g.max_delta_ppl = 0;
    CHECK(qf_certify_candidate(c, ref, QF_ARTIFACT_KV_DICT, &pl, &g, &r, &e) == QF_OK);
    printf("  random dict: delta %+.2f%%, %.0f B/token (context %.0f)\n", 100 * r.delta_ppl, r.cand_kv_bytes_per_token, bpt);
    CHECK(!r.passed && r.delta_ppl > 0 && r.kld_mean > 0 && r.top1 < 1);
    CHECK(r.cand_kv_bytes_per_token < bpt);
    /* restored: same modes, same size, the same numbers as the reference */
    CHECK(!qf_context_bound(c, NULL) && qf_context_params_get(c)->kv_k == QF_KV_F16 &&
          qf_context_params_get(c)->kv_v == QF_KV_F16 && qf_context_kv_bytes_per_token(c) == bpt);
    qf_ppl_params pp = qf_ppl_default_params();
    pp.n_ctx = NCTX;
    pp.n_chunks = 2;
    qf_ppl_result pr;
    CHECK(qf_perplexity_text(c, text, len, &pp, &pr, &e) == QF_OK);
    CHECK(pr.ppl == qf_certify_ref_ppl(ref));
    qf_certify_ref_free(ref);
    qf_payload_free(&pl);
    free(atoms);
    free(text);
    qf_context_free(c);
    qf_model_free(m);
}


/* A cache that stores K before RoPE and rotates on read gives bit-identical logits with f32 K
 * (f16 K: rounded before the rotation instead of after, so only close), and a capture with k_prerope keeps K before RoPE (position 0: RoPE is the identity). */
TEST(prerope_k_cache_is_bit_identical) {
    const char *mp = MODEL();
    if (!mp) SKIP("demo model not in ../shared/data");
    qf_error e = {0};
    qf_model *m = qf_model_load(mp, &e);
    if (!m) SKIP("demo model did not load");
    const qf_hparams *hp = qf_model_hparams(m);
    enum { N = 40 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 37 + 11) % hp->n_vocab;
    for (int mode = 0; mode < 2; mode++) {
        qf_context_params cp = qf_context_default_params();
        cp.n_ctx = 64, cp.n_threads = 2, cp.device = QF_DEVICE_CPU;
        cp.kv_k = cp.kv_v = mode ? QF_KV_F16 : QF_KV_F32;
        qf_context *c = qf_context_new(m, &cp, &e);
        CHECK(c != NULL);
        if (!c) break;
        size_t nl = (size_t)hp->n_vocab * 8;
        float *a = malloc(nl * sizeof(float)), *b = malloc(nl * sizeof(float));
        /* a prefill of 32 then 8 single-token decodes */
        CHECK(qf_decode(c, tok, 32, 0, a, 31, &e) == QF_OK);
        for (int i = 32; i < N; i++) CHECK(qf_decode(c, tok + i, 1, i, a + (size_t)(i - 32) * hp->n_vocab, 0, &e) == QF_OK);
        qf_kv_stream_spec spec[2] = {{.mode = cp.kv_k, .prerope = true}, {.mode = cp.kv_v}};
        qf_kv_cache_free(&c->kv);
        CHECK(qf_kv_cache_init_spec(&c->kv, hp, cp.n_ctx, spec, &e) == QF_OK);
        CHECK(c->kv.k_prerope);
        CHECK(qf_decode(c, tok, 32, 0, b, 31, &e) == QF_OK);
        for (int i = 32; i < N; i++) CHECK(qf_decode(c, tok + i, 1, i, b + (size_t)(i - 32) * hp->n_vocab, 0, &e) == QF_OK);
        double md = 0;
        for (size_t i = 0; i < nl; i++) md = fmax(md, fabs((double)a[i] - b[i]));
        /* f32: bit-identical; f16 rounds before instead of after the rotation: close */
        if (mode == 0) CHECK_MSG(memcmp(a, b, nl * sizeof(float)) == 0, "f32: max |diff| %g", md);
        else CHECK_MSG(md > 0 && md < 0.05, "f16: max |diff| %g", md);
        free(a), free(b);
        qf_context_free(c);
    }
    /* capture: pre-RoPE K equals post-RoPE K at position 0 and differs later; V is unchanged */
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = 1, cp.device = QF_DEVICE_CPU;
    qf_context *c = qf_context_new(m, &cp, &e);
    qf_capture_params pp = {.max_per_layer = 4096, .seed = 1}, pq = pp;
    pq.k_prerope = true;
    qf_capture *post = qf_capture_new(hp, &pp, &e), *pre = qf_capture_new(hp, &pq, &e);
    CHECK(post && pre);
    CHECK(qf_capture_run(c, post, tok, N, 64, 0, false, &e) == QF_OK);
    CHECK(qf_capture_run(c, pre, tok, N, 64, 0, false, &e) == QF_OK);
    qf_kv_capture_view vp = qf_capture_kv_view(post), vq = qf_capture_kv_view(pre);
    size_t tokf = (size_t)hp->n_head_kv * hp->head_dim;
    CHECK(memcmp(vp.k[1], vq.k[1], tokf * sizeof(float)) == 0);
    CHECK(memcmp(vp.k[1] + tokf, vq.k[1] + tokf, tokf * sizeof(float)) != 0);
    CHECK(memcmp(vp.v[1], vq.v[1], (size_t)N * tokf * sizeof(float)) == 0);
    qf_capture_free(post), qf_capture_free(pre);
    qf_context_free(c);
    qf_model_free(m);
}

/* kv-dict payloads: v1 (no version) binds with byte indices; v2 binds with bit-packed indices,
 * pre-RoPE keys and per-layer error bounds; an unknown version, a bad bound or a bad bound
 * shape are refused with the context left as it was. */
static void dict_payload(qf_payload *pl, const qf_hparams *hp, int na, int s, const float *atoms, int version) {
    qf_error e;
    qf_payload_add_int(pl, "n_atoms", na, &e);
    qf_payload_add_int(pl, "sparsity", s, &e);
    qf_payload_add_string(pl, "coef", "q8", &e);
    if (version) qf_payload_add_int(pl, "version", version, &e);
    if (version >= 2) qf_payload_add_int(pl, "k_prerope", 1, &e);
    for (int l = 0; l < hp->n_layer; l++) {
        char nk[16], nv[16];
        snprintf(nk, sizeof nk, "k.%d", l);
        snprintf(nv, sizeof nv, "v.%d", l);
        int64_t shape[2] = {na, hp->head_dim};
        qf_payload_add_f32(pl, nk, atoms, 2, shape, &e);
        qf_payload_add_f32(pl, nv, atoms, 2, shape, &e);
    }
}

TEST(dict_v2_payload_binds_and_v1_still_loads) {
    const char *mp = MODEL();
    if (!mp) SKIP("demo model not in ../shared/data");
    qf_error e = {0};
    qf_model *m = qf_model_load(mp, &e);
    if (!m) SKIP("demo model did not load");
    const qf_hparams *hp = qf_model_hparams(m);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 32, cp.n_threads = 1, cp.device = QF_DEVICE_CPU;
    qf_context *c = qf_context_new(m, &cp, &e);
    const int na = 300, s = 4; /* 9-bit indices: v1 stores u16, v2 packs 36 bits in 5 bytes */
    float *atoms = malloc((size_t)na * hp->head_dim * sizeof(float));
    uint64_t r = 7;
    for (int i = 0; i < na * hp->head_dim; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        atoms[i] = (float)((r >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int version = 0; version <= 2; version += 2) {
        qf_payload pl = {0};
        dict_payload(&pl, hp, na, s, atoms, version);
        CHECK(qf_context_bind_payload(c, QF_ARTIFACT_KV_DICT, &pl, &e) == QF_OK);
        CHECK_EQ_INT(c->kv.row_bytes[0], version ? 5 + 2 + s : 2 * s + 2 + s);
        CHECK(c->kv.k_prerope == (version == 2));
        CHECK(qf_decode(c, tok, 8, 0, NULL, 8, &e) == QF_OK);
        CHECK(qf_context_unbind(c, &e) == QF_OK && !c->kv.k_prerope);
        qf_payload_free(&pl);
    }
    /* error bounds: f32 [n_layer] in [0, 1) */
    qf_payload pl = {0};
    dict_payload(&pl, hp, na, s, atoms, 2);
    float *tol = calloc((size_t)hp->n_layer, sizeof(float));
    int64_t sh1[1] = {hp->n_layer}, sh2[1] = {hp->n_layer - 1};
    for (int l = 0; l < hp->n_layer; l++) tol[l] = 0.2f;
    qf_payload_add_f32(&pl, "k_tol", tol, 1, sh1, &e);
    CHECK(qf_context_bind_payload(c, QF_ARTIFACT_KV_DICT, &pl, &e) == QF_OK);
    CHECK(c->kv.dict[0]->tol && c->kv.dict[0]->tol[0] == 0.2f && !c->kv.dict[1]->tol);
    CHECK(qf_decode(c, tok, 8, 0, NULL, 8, &e) == QF_OK);
    CHECK(qf_context_unbind(c, &e) == QF_OK);
    qf_payload_add_f32(&pl, "v_tol", tol, 1, sh2, &e); /* wrong shape */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_DICT, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
    CHECK(strstr(e.msg, "v_tol") != NULL);
    qf_payload_free(&pl);
    memset(&pl, 0, sizeof pl);
    dict_payload(&pl, hp, na, s, atoms, 2);
    tol[1] = 1.5f;
    qf_payload_add_f32(&pl, "v_tol", tol, 1, sh1, &e); /* out of range */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_DICT, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
    qf_payload_free(&pl);
    memset(&pl, 0, sizeof pl);
    dict_payload(&pl, hp, na, s, atoms, 3);
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_DICT, &pl, &e), QF_ERR_UNSUPPORTED);
    CHECK(!qf_context_bound(c, NULL) && !c->kv.k_prerope && qf_context_params_get(c)->kv_k == QF_KV_F16);
    qf_payload_free(&pl);
    /* a zero atom: corrupt, whichever version */
    memset(&pl, 0, sizeof pl);
    memset(atoms, 0, (size_t)hp->head_dim * sizeof(float));
    dict_payload(&pl, hp, na, s, atoms, 2);
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_DICT, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
    qf_payload_free(&pl);
    free(tol), free(atoms);
    qf_context_free(c);
    qf_model_free(m);
}

TEST(engine_dict_cache_matches_forge_encoder) {
    /* vectors with structure: a few directions plus noise */
    const int hd = 64, na = 64, s = 4, n = 2048;
    float *x = malloc((size_t)n * hd * sizeof(float));
    uint64_t r = 99;
    for (int i = 0; i < n * hd; i++) {
        x[i] = ((float)qf_rand_unit(&r) - 0.5f) * (1.0f + 3.0f * (i % hd < 8));
    }
    qf_kv_dict_params dp;
    qf_kv_dict_params_default(&dp);
    dp.n_atoms = na, dp.sparsity = s, dp.iters = 3;
    qf_kv_dict d = {0};
    qf_error e = {0};
    CHECK(qf_kv_dict_learn(x, n, hd, &dp, &d, &e) == QF_OK);
    /* forge: batch OMP, coefficients rounded to f16 */
    uint16_t *idx = malloc((size_t)n * s * sizeof(uint16_t));
    float *coef = malloc((size_t)n * s * sizeof(float)), *y1 = malloc((size_t)n * hd * sizeof(float)),
          *y2 = malloc((size_t)n * hd * sizeof(float));
    CHECK(qf_kv_dict_encode(&d, x, n, s, 1, idx, coef, &e) == QF_OK);
    for (int i = 0; i < n; i++) qf_kv_coef_round(coef + (size_t)i * s, s, QF_KV_COEF_F16);
    qf_kv_dict_decode(&d, idx, coef, s, n, y1);
    /* engine: a dict cache (1 layer, 1 kv head) written and read back */
    qf_hparams hp = {0};
    hp.n_layer = 1, hp.n_head_kv = 1, hp.head_dim = hd;
    const float *at[1] = {d.atoms};
    qf_kv_stream_spec spec[2] = {{.mode = QF_KV_DICT, .n_atoms = na, .sparsity = s, .coef = QF_KV_COEF_F16, .atoms = at},
                                 {.mode = QF_KV_F32}};
    qf_kv_cache kv;
    CHECK(qf_kv_cache_init_spec(&kv, &hp, n, spec, &e) == QF_OK);
    CHECK_EQ_INT(kv.row_bytes[0], qf_kv_code_bytes(na, s, QF_KV_COEF_F16));
    qf_kv_cache_write(&kv, 0, 0, 0, n, x);
    qf_kv_cache_read_head(&kv, 0, 0, 0, n, y2);
    double e1 = qf_rel_mse(x, y1, (int64_t)n * hd), e2 = qf_rel_mse(x, y2, (int64_t)n * hd);
    printf("  rel. MSE: forge encoder %.5f, engine cache %.5f\n", e1, e2);
    CHECK(e2 < 1 && e2 <= e1 * 1.05 + 1e-6);
    /* the cache's rows (its encoder reads the Cholesky dots from each layer's qf_kv_gram_d table
     * at this size) decode to those of qf_kv_omp_ex's codes, which compute them per row: two
     * layers with different dictionaries, so a table of the wrong layer shows */
    {
        qf_kv_dict d2 = {0};
        dp.seed = 7;
        CHECK(qf_kv_dict_learn(x, n, hd, &dp, &d2, &e) == QF_OK);
        qf_hparams hp2 = hp;
        hp2.n_layer = 2;
        const float *at2[2] = {d.atoms, d2.atoms};
        qf_kv_stream_spec sp2[2] = {{.mode = QF_KV_DICT, .n_atoms = na, .sparsity = s, .coef = QF_KV_COEF_F16, .atoms = at2},
                                    {.mode = QF_KV_F32}};
        qf_kv_cache kv2;
        CHECK(qf_kv_cache_init_spec(&kv2, &hp2, n, sp2, &e) == QF_OK);
        CHECK(kv2.dict[0]->gram_d && kv2.dict[0]->gram_d[0] && kv2.dict[0]->gram_d[1]);
        qf_kv_code_fmt fmt = {.n_atoms = na, .sparsity = s, .coef = QF_KV_COEF_F16};
        void *scr = malloc(qf_kv_omp_scratch_bytes(na, s));
        uint8_t code[64];
        uint16_t ci[8];
        float cc[8], *y3 = malloc((size_t)hd * sizeof(float));
        for (int l = 0; l < 2; l++) {
            const qf_kv_dict *dl = l ? &d2 : &d;
            qf_kv_cache_write(&kv2, 0, l, 0, n, x);
            qf_kv_cache_read_head(&kv2, 0, l, 0, n, y2);
            int same = 0;
            for (int i = 0; i < n; i++) {
                qf_kv_omp_ex(dl, x + (size_t)i * hd, NULL, s, 0, scr, ci, cc);
                qf_kv_fmt_pack(&fmt, ci, cc, code);
                qf_kv_fmt_decode(&fmt, &kv2.dict[0]->layer[l], code, y3);
                same += !memcmp(y3, y2 + (size_t)i * hd, (size_t)hd * sizeof(float));
            }
            CHECK_EQ_INT(same, n);
        }
        qf_kv_cache_free(&kv2);
        qf_kv_dict_free(&d2);
        free(scr), free(y3);
    }
    /* refusals: int8/dict without data */
    qf_kv_cache bad;
    CHECK_EQ_INT(qf_kv_cache_init(&bad, &hp, 8, QF_KV_INT8, QF_KV_F32, &e), QF_ERR_ARTIFACT_NOT_CERTIFIED);
    qf_kv_cache_free(&kv);
    qf_kv_dict_free(&d);
    free(x), free(idx), free(coef), free(y1), free(y2);
}

int main(void) {
    RUN(engine_dict_cache_matches_forge_encoder);
    RUN(prerope_k_cache_is_bit_identical);
    RUN(dict_v2_payload_binds_and_v1_still_loads);
    RUN(int8_calibrate_package_load_ppl_reproduces);
    RUN(artifact_refused_on_another_model);
    RUN(certify_restores_the_context);
    RUN(failed_gate_writes_nothing);
    RUN(dict_certificate_arith_is_device);
    RUN(dict_payload_independent_of_threads);
    return test_summary();
}
