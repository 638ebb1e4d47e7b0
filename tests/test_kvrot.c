/* test_kvrot.c: --kv-rot hadamard in the CPU KV cache. A row written and read back through a
 * rotated f32 cache is the row itself (H is its own inverse); on the demo model the rotated
 * q4_0 cache has a lower KL divergence to the f32 cache than plain q4_0 on the same tokens;
 * every refusal (head_dim not a power of two, artifact modes, binding an artifact, the GPU
 * route that cannot rotate, a bad name) is a clear error with its status. Also the kv-int8
 * per-token row codec (scale exponent carried in code parities) and the int8 row layouts. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/cuda/cuda_backend.h"
#include "qforge/artifact_bind.h"
#include "qforge/kvlearn.h"
#include "qforge/model.h"
#include "qforge/ppl.h"
#include "test.h"
#include "util/util.h"

static qf_hparams hp_with(int head_dim) {
    qf_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layer = 2, hp.n_head_kv = 2, hp.head_dim = head_dim;
    return hp;
}

TEST(rot_names) {
    qf_kv_rot r = QF_KV_ROT_HADAMARD;
    CHECK(qf_kv_rot_from_name("none", &r) && r == QF_KV_ROT_NONE);
    CHECK(qf_kv_rot_from_name("Hadamard", &r) && r == QF_KV_ROT_HADAMARD);
    CHECK(!qf_kv_rot_from_name("walsh", &r));
    CHECK(!qf_kv_rot_from_name("", &r));
    CHECK(!strcmp(qf_kv_rot_name(QF_KV_ROT_HADAMARD), "hadamard"));
    CHECK(!strcmp(qf_kv_rot_name(QF_KV_ROT_NONE), "none"));
}

/* f32 storage: write rotated, read rotated back == the input (up to rounding); q8_0 storage:
 * the rotated round trip stays within q8_0's error and is not bit-identical to the input */
TEST(rot_round_trip) {
    qf_hparams hp = hp_with(64);
    int n_pos = 5, nh = hp.n_head_kv, hd = hp.head_dim;
    float *src = malloc(sizeof(float) * n_pos * nh * hd), *dst = malloc(sizeof(float) * n_pos * hd);
    uint64_t s = 7;
    for (int i = 0; i < n_pos * nh * hd; i++) src[i] = (float)((qf_xorshift64s(&s) >> 11) * 0x1.0p-53 * 2 - 1) * (i % 17 == 3 ? 20 : 1);
    qf_kv_mode modes[2] = {QF_KV_F32, QF_KV_Q8_0};
    for (int mi = 0; mi < 2; mi++) {
        qf_kv_cache kv;
        qf_error e = {0};
        CHECK(qf_kv_cache_init(&kv, &hp, 16, modes[mi], modes[mi], &e) == QF_OK);
        CHECK(qf_kv_cache_set_rot(&kv, QF_KV_ROT_HADAMARD, &e) == QF_OK);
        qf_kv_cache_write(&kv, 1, 1, 3, n_pos, src);
        for (int h = 0; h < nh; h++) {
            float *all = malloc(sizeof(float) * (3 + n_pos) * hd);
            qf_kv_cache_read_head(&kv, 1, 1, h, 3 + n_pos, all);
            double maxd = 0, maxa = 0;
            for (int p = 0; p < n_pos; p++)
                for (int d = 0; d < hd; d++) {
                    double a = src[((size_t)p * nh + h) * hd + d], b = all[(size_t)(3 + p) * hd + d];
                    if (fabs(a - b) > maxd) maxd = fabs(a - b);
                    if (fabs(a) > maxa) maxa = fabs(a);
                }
            if (mi == 0) CHECK_MSG(maxd < 1e-5 * maxa, "f32 rotated round trip: max diff %g", maxd);
            else CHECK_MSG(maxd > 0 && maxd < 0.02 * maxa, "q8_0 rotated round trip: max diff %g of %g", maxd, maxa);
            free(all);
        }
        (void)dst;
        qf_kv_cache_free(&kv);
        CHECK(kv.rot_buf == NULL && kv.rot == QF_KV_ROT_NONE);
    }
    free(src);
    free(dst);
}

TEST(rot_refusals_in_the_cache) {
    qf_error e = {0};
    qf_kv_cache kv;
    /* head_dim 96: q8_0 is fine (a multiple of 32), the rotation is not */
    qf_hparams hp = hp_with(96);
    CHECK(qf_kv_cache_init(&kv, &hp, 8, QF_KV_Q8_0, QF_KV_Q8_0, &e) == QF_OK);
    CHECK(qf_kv_cache_set_rot(&kv, QF_KV_ROT_HADAMARD, &e) == QF_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "power of two") && strstr(e.msg, "96"));
    CHECK(kv.rot == QF_KV_ROT_NONE && kv.rot_buf == NULL); /* unchanged */
    CHECK(qf_kv_cache_set_rot(&kv, (qf_kv_rot)7, &e) == QF_ERR_ARG);
    CHECK(qf_kv_cache_set_rot(&kv, QF_KV_ROT_NONE, NULL) == QF_OK);
    qf_kv_cache_free(&kv);
    /* an int8 cache (an artifact's storage) refuses the rotation */
    hp = hp_with(32);
    float sc[2 * 2 * 32];
    for (int i = 0; i < 2 * 2 * 32; i++) sc[i] = 0.01f;
    qf_kv_stream_spec spec[2] = {{.mode = QF_KV_INT8, .int8_scale = sc}, {.mode = QF_KV_F16}};
    CHECK(qf_kv_cache_init_spec(&kv, &hp, 8, spec, &e) == QF_OK);
    CHECK(qf_kv_cache_set_rot(&kv, QF_KV_ROT_HADAMARD, &e) == QF_ERR_ARG);
    CHECK(strstr(e.msg, "int8") != NULL);
    CHECK(qf_kv_cache_set_rot(&kv, QF_KV_ROT_HADAMARD, NULL) == QF_ERR_ARG); /* err optional */
    qf_kv_cache_free(&kv);
}

static qf_model *demo(void) {
    const char *p = test_data("models/qforge-demo-11m-f16.gguf");
    if (!p) return NULL;
    qf_error e = {0};
    return qf_model_load(p, &e);
}

static char *demo_text(size_t *len) {
    char *t = NULL;
    qf_error e = {0};
    if (qf_read_file("assets/corpora/kerneldoc-demo/docs.txt", &t, len, &e)) return NULL;
    if (*len > 60000) *len = 60000;
    return t;
}

/* q4_0 + hadamard vs q4_0 on the same tokens, both against the f32 cache: lower mean KLD */
TEST(rot_q4_0_beats_plain_q4_0) {
    qf_model *m = demo();
    if (!m) SKIP("demo model not in ../shared/data");
    size_t len = 0;
    char *text = demo_text(&len);
    CHECK(text != NULL);
    if (!text) {
        qf_model_free(m);
        return;
    }
    char base[4200];
    snprintf(base, sizeof base, "%s/ref.kld", test_tmpdir());
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 128, cp.n_threads = 2, cp.device = QF_DEVICE_CPU;
    qf_ppl_params pp = qf_ppl_default_params();
    pp.n_ctx = 128, pp.n_chunks = 6;
    double kld[3] = {0}, ppl[3] = {0};
    for (int run = 0; run < 3; run++) {
        qf_error e = {0};
        cp.kv_k = cp.kv_v = run == 0 ? QF_KV_F32 : QF_KV_Q4_0;
        cp.kv_rot = run == 2 ? QF_KV_ROT_HADAMARD : QF_KV_ROT_NONE;
        qf_context *c = qf_context_new(m, &cp, &e);
        CHECK_MSG(c != NULL, "%s", e.msg);
        if (!c) break;
        pp.kl_base_write = run == 0 ? base : NULL;
        pp.kl_base_read = run == 0 ? NULL : base;
        qf_ppl_result r;
        CHECK_MSG(qf_perplexity_text(c, text, len, &pp, &r, &e) == QF_OK, "%s", e.msg);
        ppl[run] = r.ppl;
        kld[run] = run ? r.kld_mean : 0;
        qf_context_free(c);
    }
    printf("  f32 PPL %.4f; q4_0 PPL %.4f KLD %.5f; q4_0+hadamard PPL %.4f KLD %.5f\n", ppl[0], ppl[1], kld[1], ppl[2],
           kld[2]);
    CHECK(kld[1] > 0 && kld[2] > 0);
    CHECK_MSG(kld[2] < kld[1], "rotated q4_0 KLD %g should be below plain q4_0's %g", kld[2], kld[1]);
    CHECK(fabs(ppl[2] - ppl[0]) < fabs(ppl[1] - ppl[0]) + 0.02 * ppl[0]);
    free(text);
    qf_model_free(m);
}

/* a context with --kv-rot refuses an artifact binding; --device cuda refuses a rotation the
 * backend cannot run, --device auto runs it on the CPU */
TEST(rot_refusals_in_the_context) {
    qf_model *m = demo();
    if (!m) SKIP("demo model not in ../shared/data");
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 32, cp.n_threads = 1, cp.kv_rot = QF_KV_ROT_HADAMARD, cp.device = QF_DEVICE_CPU;
    qf_error e = {0};
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK_MSG(c != NULL, "%s", e.msg);
    if (c) {
        const qf_hparams *hp = qf_model_hparams(m);
        qf_payload pl = {0};
        int64_t shape[2] = {hp->n_layer, hp->n_head_kv};
        float *s = malloc(sizeof(float) * hp->n_layer * hp->n_head_kv);
        for (int i = 0; i < hp->n_layer * hp->n_head_kv; i++) s[i] = 0.05f;
        CHECK(qf_payload_add_f32(&pl, "k_scale", s, 2, shape, &e) == QF_OK);
        CHECK(qf_payload_add_f32(&pl, "v_scale", s, 2, shape, &e) == QF_OK);
        CHECK(qf_context_bind_payload(c, QF_ARTIFACT_KV_INT8, &pl, &e) == QF_ERR_ARG);
        CHECK(strstr(e.msg, "--kv-rot") != NULL);
        CHECK(!qf_context_bound(c, NULL));
        CHECK(qf_context_bind_payload(c, QF_ARTIFACT_KV_INT8, &pl, NULL) == QF_ERR_ARG); /* err optional */
        /* the same payload binds to a context without the rotation */
        qf_context_params cp2 = cp;
        cp2.kv_rot = QF_KV_ROT_NONE;
        qf_context *c2 = qf_context_new(m, &cp2, &e);
        CHECK(c2 && qf_context_bind_payload(c2, QF_ARTIFACT_KV_INT8, &pl, &e) == QF_OK);
        qf_context_free(c2);
        free(s);
        qf_payload_free(&pl);
        qf_context_free(c);
    }
    if (!qf_cuda_backend_kv_rot_ok(QF_KV_ROT_HADAMARD)) {
        cp.device = QF_DEVICE_CUDA;
        c = qf_context_new(m, &cp, &e);
        CHECK(c == NULL);
        CHECK_EQ_INT(e.code, QF_ERR_UNSUPPORTED);
        CHECK(strstr(e.msg, "--kv-rot hadamard") && strstr(e.msg, "--device cpu"));
        qf_context_free(c);
        cp.device = QF_DEVICE_AUTO;
        c = qf_context_new(m, &cp, &e);
        CHECK_MSG(c != NULL, "%s", e.msg);
        if (c) CHECK(qf_context_device(c) == QF_DEVICE_CPU);
        qf_context_free(c);
    }
    qf_model_free(m);
}

/* the per-token int8 codec: the exponent survives, the error is within about one step of the
 * row's absmax/127, zero and tiny rows stay finite, and it beats a static absmax scale on a row
 * far below the calibrated range */
TEST(int8_token_codec) {
    uint64_t s = 11;
    int8_t q[128];
    float x[128], y[128];
    for (int trial = 0; trial < 200; trial++) {
        int n = trial % 2 ? 128 : 64;
        float mag = (float)exp2((double)(trial % 28) - 12);
        for (int i = 0; i < n; i++) x[i] = mag * (float)(((qf_xorshift64s(&s) >> 11) * 0x1.0p-53) * 2 - 1);
        qf_kv_int8_token_quantize(x, q, n);
        qf_kv_int8_token_dequantize(q, y, n);
        float amax = 0, maxd = 0;
        double se = 0;
        for (int i = 0; i < n; i++) {
            amax = fmaxf(amax, fabsf(x[i]));
            maxd = fmaxf(maxd, fabsf(x[i] - y[i]));
            se += (double)(x[i] - y[i]) * (x[i] - y[i]);
        }
        float step = amax / 127.0f * 1.1f; /* the 1/8-octave exponent grid */
        CHECK_MSG(maxd <= 1.6f * step, "trial %d: max error %g, step %g", trial, maxd, step);
        /* mean squared error near the uniform quantizer's step^2/12 (parity fixes cost little) */
        CHECK_MSG(se / n < 0.2 * step * step, "trial %d: mse %g vs step^2 %g", trial, se / n, step * step);
    }
    memset(x, 0, sizeof x);
    qf_kv_int8_token_quantize(x, q, 64);
    qf_kv_int8_token_dequantize(q, y, 64);
    for (int i = 0; i < 64; i++) CHECK(fabsf(y[i]) < 1e-4f);
    x[3] = NAN, x[5] = 1.0f;
    qf_kv_int8_token_quantize(x, q, 64);
    qf_kv_int8_token_dequantize(q, y, 64);
    for (int i = 0; i < 64; i++) CHECK(isfinite(y[i]));
    CHECK(fabsf(y[5] - 1.0f) < 0.02f);
}

/* int8 row layouts in the cache: rotated static and per-token rows read back close to what was
 * written; a per-token layout needs head_dim a multiple of 8, a rotated one a power of two */
TEST(int8_layouts_in_the_cache) {
    qf_hparams hp = hp_with(64);
    int nh = hp.n_head_kv, hd = hp.head_dim, n_pos = 3;
    float sc[2 * 2 * 64], src[3 * 2 * 64], got[3 * 64];
    uint64_t s = 5;
    for (int i = 0; i < 2 * 2 * 64; i++) sc[i] = 4.0f / 127;
    for (int i = 0; i < n_pos * nh * hd; i++) src[i] = (float)(((qf_xorshift64s(&s) >> 11) * 0x1.0p-53) * 2 - 1);
    for (int lay = 0; lay < 4; lay++) {
        qf_kv_cache kv;
        qf_error e = {0};
        qf_kv_stream_spec spec[2] = {{.mode = QF_KV_INT8, .int8_scale = sc, .int8_layout = lay},
                                     {.mode = QF_KV_INT8, .int8_scale = sc, .int8_layout = lay}};
        CHECK_MSG(qf_kv_cache_init_spec(&kv, &hp, 8, spec, &e) == QF_OK, "%s", e.msg);
        qf_kv_cache_write(&kv, 0, 1, 0, n_pos, src);
        qf_kv_cache_read_head(&kv, 0, 1, 1, n_pos, got);
        double maxd = 0;
        for (int p = 0; p < n_pos; p++)
            for (int d = 0; d < hd; d++) maxd = fmax(maxd, fabs(src[((size_t)p * nh + 1) * hd + d] - got[p * hd + d]));
        CHECK_MSG(maxd < 0.05, "layout %d: max error %g", lay, maxd);
        qf_kv_cache_free(&kv);
    }
    qf_error e = {0};
    qf_kv_cache kv;
    hp = hp_with(96); /* no power of two: no rotation; a multiple of 8: per-token is fine */
    float sc96[2 * 2 * 96];
    for (int i = 0; i < 2 * 2 * 96; i++) sc96[i] = 0.01f;
    qf_kv_stream_spec sp[2] = {{.mode = QF_KV_INT8, .int8_scale = sc96, .int8_layout = QF_KV_INT8_TOKEN_ROT},
                               {.mode = QF_KV_F16}};
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 8, sp, &e), QF_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "power of two") != NULL);
    sp[0].int8_layout = QF_KV_INT8_TOKEN;
    CHECK(qf_kv_cache_init_spec(&kv, &hp, 8, sp, &e) == QF_OK);
    qf_kv_cache_free(&kv);
    sp[0].int8_layout = 9;
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 8, sp, &e), QF_ERR_ARG);
}

int main(void) {
    RUN(rot_names);
    RUN(rot_round_trip);
    RUN(rot_refusals_in_the_cache);
    RUN(rot_q4_0_beats_plain_q4_0);
    RUN(rot_refusals_in_the_context);
    RUN(int8_token_codec);
    RUN(int8_layouts_in_the_cache);
    return test_summary();
}
