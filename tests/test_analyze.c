/* test_analyze.c: the end-metric analysis (qforge/analyze.h): the Pareto frontier and the
 * verdicts on synthetic points, the SVG, parameter errors, a tiny end-to-end run; and the run
 * setup + generation loop every command shares (qforge/run.h). */
#include <unistd.h>

#include "qforge/analyze.h"
#include "qforge/run.h"
#include "test.h"

static qf_analyze_point pt(const char *m, const char *label, double bits, double kld, double err) {
    qf_analyze_point p;
    memset(&p, 0, sizeof p);
    snprintf(p.method, sizeof p.method, "%s", m);
    snprintf(p.label, sizeof p.label, "%s", label);
    p.bits_per_element = bits;
    p.bits_per_element_with_tables = bits + 1;
    p.kld_mean = kld;
    p.kld_err = err;
    p.passes_gate = kld < 0.1;
    p.dominated_by = -1;
    return p;
}

/* points: 0 f16 16/1e-6, 1 q8_0 8.5/6e-5, 2 int8 per-channel 8/7e-3, 3 int8 per-head 8/3e-4,
 * 4 q4_0 4.5/1.8e-2, 5 q8_0+h 9/6.5e-5 (noise 1e-5: within noise of q8_0), 6 dict NaN,
 * 7 dict 1.5/2.5 */
static void synthetic(qf_analyze_report *r, qf_analyze_point *P) {
    memset(r, 0, sizeof *r);
    P[0] = pt("f16", "f16", 16, 1e-6, 1e-8);
    P[1] = pt("q8_0", "q8_0", 8.5, 6e-5, 1e-5);
    P[2] = pt("kv-int8", "per-channel", 8, 7e-3, 1e-4);
    P[3] = pt("kv-int8", "per-head", 8, 3e-4, 1e-5);
    P[4] = pt("q4_0", "q4_0", 4.5, 1.8e-2, 1e-3);
    P[5] = pt("q8_0+hadamard", "q8_0+hadamard", 9, 6.5e-5, 1e-5);
    P[6] = pt("kv-dict", "64x4-f16", 1.5, NAN, 0);
    P[7] = pt("kv-dict", "256x4-f16", 1.5, 2.5, 0.1);
    r->points = P;
    r->n_points = 8;
}

static const char *const NAMES[] = {"f16", "q8_0", "q4_0", "q8_0+hadamard", "kv-int8", "kv-dict", "kv-rq"};

TEST(judge_frontier_and_verdicts) {
    qf_analyze_point P[8];
    qf_analyze_report r;
    synthetic(&r, P);
    qf_analyze_skip sk = {"kv-rq", "2b", "not built"};
    r.skipped = &sk;
    r.n_skipped = 1;
    qf_error e = {0};
    CHECK(qf_analyze_judge(&r, NAMES, 7, &e) == QF_OK);
    /* frontier by increasing bits: dict 1.5, q4_0 4.5, int8 per-head 8, q8_0 8.5, f16 16 */
    CHECK_EQ_INT(r.n_frontier, 5);
    int want[5] = {7, 4, 3, 1, 0};
    for (int k = 0; k < 5 && k < r.n_frontier; k++) CHECK_EQ_INT(r.frontier[k], want[k]);
    CHECK(!P[2].on_frontier && P[2].dominated_by == 3 && !P[2].within_noise);
    CHECK(!P[5].on_frontier && P[5].dominated_by == 1 && P[5].within_noise);
    CHECK(!P[6].on_frontier && P[6].dominated_by == -1); /* NaN is never judged */
    CHECK_EQ_INT(r.n_verdicts, 7);
    CHECK(strstr(r.verdicts[0].verdict, "on the frontier at 16.00 b") == r.verdicts[0].verdict);
    CHECK(strstr(r.verdicts[3].verdict, "dominated at 9.00 b by q8_0 (8.50 b, KLD 6.00e-05 vs 6.50e-05") != NULL);
    CHECK(strstr(r.verdicts[3].verdict, "within noise") != NULL);
    CHECK(strstr(r.verdicts[4].verdict, "on the frontier at 8.00 b (per-head") != NULL);
    CHECK(strstr(r.verdicts[4].verdict, "dominated elsewhere: at 8.00 b (per-channel) by kv-int8 per-head") != NULL);
    CHECK(strstr(r.verdicts[5].verdict, "fails the default gate") != NULL);
    CHECK(strstr(r.verdicts[5].verdict, "no finite KLD") != NULL);
    CHECK(!strcmp(r.verdicts[6].verdict, "not measured: not built"));
    CHECK_EQ_INT(r.verdicts[4].n_points, 2);
    CHECK_EQ_INT(r.verdicts[4].n_on_frontier, 1);
    /* judged on the rate with tables: every rate moves by one bit, the frontier is the same */
    r.tables_in_rate = true;
    CHECK(qf_analyze_judge(&r, NAMES, 7, &e) == QF_OK);
    CHECK_EQ_INT(r.n_frontier, 5);
    CHECK(strstr(r.verdicts[0].verdict, "17.00 b") != NULL);
    /* an equal point ties: both stay on the frontier */
    P[5].bits_per_element = 8.5, P[5].kld_mean = 6e-5;
    r.tables_in_rate = false;
    CHECK(qf_analyze_judge(&r, NAMES, 7, &e) == QF_OK);
    CHECK(P[5].on_frontier && P[1].on_frontier);
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
        qf_analyze_report_print(&r, devnull);
        fclose(devnull);
    }
    free(r.frontier);
    free(r.verdicts);
}

TEST(svg_written_atomically) {
    qf_analyze_point P[8];
    qf_analyze_report r;
    synthetic(&r, P);
    qf_error e = {0};
    CHECK(qf_analyze_judge(&r, NAMES, 7, &e) == QF_OK);
    char path[4096];
    snprintf(path, sizeof path, "%s/kld.svg", test_tmpdir());
    CHECK(qf_analyze_write_svg(&r, path, &e) == QF_OK);
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL);
    if (fp) {
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf - 1, fp);
        buf[n] = 0;
        fclose(fp);
        CHECK(strstr(buf, "<svg") && strstr(buf, "</svg>"));
        CHECK(strstr(buf, "Pareto frontier") && strstr(buf, "stroke-dasharray"));
        CHECK(strstr(buf, ">kv-int8</text>") && strstr(buf, ">q8_0+hadamard</text>"));
        CHECK(strstr(buf, "mean KL divergence (log)") != NULL);
    }
    /* a directory that does not exist: an error, nothing half-written */
    CHECK(qf_analyze_write_svg(&r, "/nonexistent-dir/kld.svg", &e) == QF_ERR_IO);
    /* nothing to plot */
    qf_analyze_report empty;
    memset(&empty, 0, sizeof empty);
    CHECK(qf_analyze_write_svg(&empty, path, &e) == QF_ERR_ARG);
    free(r.frontier);
    free(r.verdicts);
}

TEST(run_params_errors) {
    qf_analyze_params p;
    qf_analyze_params_default(&p);
    qf_analyze_report r;
    qf_error e = {0};
    CHECK(qf_analyze_run(&p, &r, &e) == QF_ERR_ARG); /* no model */
    qf_analyze_report_free(&r);
    p.model_path = "/nonexistent.gguf";
    p.methods = "q8_0,bogus";
    CHECK(qf_analyze_run(&p, &r, &e) == QF_ERR_ARG);
    CHECK(strstr(e.msg, "bogus") != NULL && strstr(e.msg, "q4_0+hadamard") != NULL);
    qf_analyze_report_free(&r);
    p.methods = NULL;
    p.n_ctx = 4;
    CHECK(qf_analyze_run(&p, &r, &e) == QF_ERR_ARG);
    qf_analyze_report_free(&r);
    p.n_ctx = 512;
    p.dict[0].sparsity = 300; /* more than its atoms */
    CHECK(qf_analyze_run(&p, &r, &e) == QF_ERR_ARG);
    qf_analyze_report_free(&r);
    qf_analyze_params_default(&p);
    p.model_path = "/nonexistent.gguf";
    CHECK(qf_analyze_run(&p, &r, &e) == QF_ERR_IO);
    CHECK(strstr(e.msg, "nonexistent") != NULL);
    qf_analyze_report_free(&r);
    /* an empty corpus */
    char dir[4096], f[4200];
    snprintf(dir, sizeof dir, "%s", test_tmpdir());
    snprintf(f, sizeof f, "%s/empty.txt", dir);
    FILE *fp = fopen(f, "w");
    if (fp) fclose(fp);
    const char *paths[1] = {dir};
    p.corpus_paths = paths;
    p.n_corpus_paths = 1;
    CHECK(qf_analyze_run(&p, &r, &e) == QF_ERR_CORPUS_EMPTY);
    qf_analyze_report_free(&r);
    for (int i = 0; qf_analyze_method_name(i); i++) CHECK(qf_analyze_method_name(i)[0] != 0);
    CHECK(qf_analyze_method_name(-1) == NULL);
    CHECK(qf_analyze_method_learned(5) && !qf_analyze_method_learned(0));
}

/* The whole pipeline on the demo model at toy sizes: plain, rotated and learned points, a
 * learner without enough vectors skipped. */
TEST(tiny_end_to_end) {
    const char *model = test_data("models/qforge-demo-11m-f16.gguf");
    if (!model) SKIP("models/qforge-demo-11m-f16.gguf is missing from the shared data");
    qf_analyze_params p;
    qf_analyze_params_default(&p);
    p.model_path = model;
    p.n_ctx = 64;
    p.eval_chunks = 2;
    p.max_calib_tokens = 512;
    p.capture_per_layer = 256;
    p.n_threads = 2;
    p.methods = "f16,q4_0+hadamard,kv-int8,kv-dict";
    p.dict[0] = (qf_dict_config){16, 2};
    p.dict[1] = (qf_dict_config){4096, 2}; /* more atoms than captured vectors: skipped */
    p.n_dict = 2;
    p.dict_iters = 2;
    p.capture_device = QF_DEVICE_CPU;
    qf_analyze_report r;
    qf_error e = {0};
    qf_status st = qf_analyze_run(&p, &r, &e);
    CHECK_MSG(st == QF_OK, "%s", e.msg);
    if (st == QF_OK) {
        CHECK_EQ_INT(r.n_points, 5); /* f16, q4_0+hadamard, kv-int8 x 2, kv-dict 16x2 */
        CHECK_EQ_INT(r.n_skipped, 1);
        CHECK(r.n_skipped == 1 && !strcmp(r.skipped[0].method, "kv-dict") && strstr(r.skipped[0].reason, "4096"));
        CHECK_NEAR(r.points[0].bits_per_element, 16.0, 1e-9);
        CHECK_NEAR(r.points[1].bits_per_element, 4.5, 1e-9);
        CHECK_NEAR(r.points[2].bits_per_element, 8.0, 1e-9);
        CHECK(r.points[2].table_bytes > 0 && r.points[2].bits_per_element_with_tables > 8.0);
        CHECK(!strcmp(r.points[4].label, "16x2-f16"));
        CHECK_NEAR(r.points[4].bits_per_element, (2 * 1 + 2 * 2) * 8.0 / 64, 1e-9); /* stored bytes */
        CHECK(r.n_frontier >= 2 && r.n_verdicts == 4);
        CHECK(r.n_chunks == 2 && r.n_ctx == 64 && r.n_scored > 0 && r.ref_ppl > 1);
        CHECK(r.cross_check_tokens > 0 && r.cross_check_max_rel_diff < 1e-3);
        for (int i = 0; i < r.n_points; i++) CHECK(r.points[i].kld_mean > -1e-4 && isfinite(r.points[i].delta_ppl));
        CHECK(r.points[1].kld_mean < r.points[4].kld_mean); /* 4.5 bits beat 0.75 */
    }
    qf_analyze_report_free(&r);
}

/* head_dim 8 (stories260K): q4_0 tiles by 32, so neither plain nor rotated q4_0 can run; with
 * nothing measured the run fails and says why. */
TEST(nothing_measurable) {
    /* (without ../shared: the random-weight fixture of stories260K's shape, head_dim 8 too) */
    const char *model = test_data("models/stories260K.gguf");
    if (!model) model = test_data("models/synthetic-hd8-f32.gguf");
    if (!model) SKIP("models/stories260K.gguf is missing from the shared data");
    qf_analyze_params p;
    qf_analyze_params_default(&p);
    p.model_path = model;
    p.n_ctx = 64;
    p.eval_chunks = 2;
    p.n_threads = 2;
    p.methods = "q4_0,q4_0+hadamard";
    qf_analyze_report r;
    qf_error e = {0};
    CHECK(qf_analyze_run(&p, &r, &e) == QF_ERR_ARG);
    CHECK(strstr(e.msg, "no method could be measured") && strstr(e.msg, "head_dim"));
    CHECK_EQ_INT(r.n_skipped, 2);
    CHECK_EQ_INT(r.n_points, 0);
    qf_analyze_report_free(&r);
}

/* ---- run setup and generation ---- */

typedef struct {
    char text[4096];
    size_t n;
    int calls;
} sink;

static void collect(void *user, const char *t, size_t len) {
    sink *s = user;
    if (s->n + len < sizeof s->text) memcpy(s->text + s->n, t, len), s->n += len;
    s->text[s->n] = 0;
    s->calls++;
}

TEST(run_open_errors) {
    qf_run_params p = qf_run_default_params();
    qf_run r;
    qf_error e = {0};
    CHECK(qf_run_open(&p, &r, &e) == QF_ERR_ARG);
    CHECK(r.model == NULL && r.ctx == NULL);
    p.model_path = "/nonexistent.gguf";
    CHECK(qf_run_open(&p, &r, &e) == QF_ERR_IO);
    CHECK(r.model == NULL);
    p.trust_key = "key.pem";
    CHECK(qf_run_open(&p, &r, &e) == QF_ERR_ARG);
    const char *model = test_data("models/stories260K.gguf");
    if (!model) model = test_data("models/synthetic-hd8-f32.gguf"); /* a fresh clone: the same shape */
    if (!model) SKIP("models/stories260K.gguf is missing from the shared data");
    p = qf_run_default_params();
    p.model_path = model;
    p.artifact_path = "/nonexistent.qfa";
    CHECK(qf_run_open(&p, &r, &e) != QF_OK);
    CHECK(r.model == NULL && r.ctx == NULL && !r.has_artifact);
    qf_run_close(&r); /* closing a zeroed run is fine */
    /* defaults resolved once: n_ctx 0 is the model's context, n_batch 0 is n_ctx */
    p.artifact_path = NULL;
    CHECK(qf_run_open(&p, &r, &e) == QF_OK);
    if (r.ctx) {
        CHECK_EQ_INT(qf_context_params_get(r.ctx)->n_ctx, qf_model_hparams(r.model)->n_ctx_train);
        CHECK_EQ_INT(qf_context_params_get(r.ctx)->n_batch, qf_context_params_get(r.ctx)->n_ctx);
    }
    qf_run_close(&r);
    qf_run_close(&r);
}

TEST(generate_seeded_and_errors) {
    const char *model = test_data("models/stories260K.gguf");
    if (!model) SKIP("models/stories260K.gguf is missing from the shared data");
    qf_run_params p = qf_run_default_params();
    p.model_path = model;
    p.cp.n_ctx = 64;
    p.cp.n_batch = 2; /* the prompt goes in several batches */
    p.cp.n_threads = 1;
    qf_run r;
    qf_error e = {0};
    CHECK(qf_run_open(&p, &r, &e) == QF_OK);
    if (!r.ctx) return;
    qf_generate_params gp = {.n_predict = 20, .sampler = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 7}};
    sink a = {0}, b = {0};
    gp.on_text = collect;
    gp.user = &a;
    qf_generate_stats gs;
    const char *prompt = "Once upon a time";
    CHECK(qf_generate(r.ctx, prompt, strlen(prompt), &gp, &gs, &e) == QF_OK);
    gp.user = &b;
    CHECK(qf_generate(r.ctx, prompt, strlen(prompt), &gp, &gs, &e) == QF_OK);
    CHECK(a.n > strlen(prompt) && !strncmp(a.text, prompt, strlen(prompt))); /* the prompt comes first */
    CHECK(!strcmp(a.text, b.text));                                         /* a seed reproduces the text */
    CHECK(gs.n_prompt == 5 && gs.n_generated > 0 && gs.n_generated <= 20);
    /* the context bounds the generation: 64 positions, prompt 5 */
    gp.n_predict = 1000;
    gp.sampler.temp = 0;
    gp.user = &a;
    CHECK(qf_generate(r.ctx, prompt, strlen(prompt), &gp, &gs, &e) == QF_OK);
    CHECK(gs.n_prompt + gs.n_generated <= 64);
    /* a prompt that does not fit: an error before anything is printed */
    static char big[4096];
    for (size_t i = 0; i + 1 < sizeof big; i++) big[i] = (char)('a' + i % 26);
    sink c = {0};
    gp.user = &c;
    CHECK(qf_generate(r.ctx, big, strlen(big), &gp, &gs, &e) == QF_ERR_ARG);
    CHECK(strstr(e.msg, "context size 64") != NULL && c.calls == 0);
    qf_run_close(&r);
}

int main(void) {
    RUN(judge_frontier_and_verdicts);
    RUN(svg_written_atomically);
    RUN(run_params_errors);
    RUN(tiny_end_to_end);
    RUN(nothing_measurable);
    RUN(run_open_errors);
    RUN(generate_seeded_and_errors);
    return test_summary();
}
