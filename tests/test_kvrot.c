/* test_kvrot.c: --kv-rot hadamard in the CPU KV cache. A row written and read back through a
 * rotated f32 cache is the row itself (H is its own inverse); on the demo model the rotated
 * q4_0 cache has a lower KL divergence to the f32 cache than plain q4_0 on the same tokens;
 * every refusal (head_dim not a power of two, artifact modes, binding an artifact, the GPU
 * route that cannot rotate, a bad name) is a clear error with its status. Also the kv-int8
 * per-token row codec (scale exponent carried in code parities), the entropy-coded row codec
 * (against a bit-by-bit oracle of its documented layout) and the int8 row layouts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/engine.h"
#include "engine/kv_codes.h"
#include "eval/kld.h"
#include "kernels/gemm.h"
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
        if (run) { /* ΔPPL from the paired per-chunk differences: PPL / PPL(base) - 1 but for the tokens the
                    * base floors (none or nearly none on this text), with an error */
            double ratio = r.ppl / r.ppl_base - 1;
            CHECK_MSG(r.delta_ppl <= ratio + 1e-5 && r.delta_ppl > ratio - 1e-3, "%g vs %g", r.delta_ppl, ratio);
            CHECK(r.delta_ppl_err > 0 && r.delta_ppl_err < 0.5);
        } else {
            CHECK(r.delta_ppl == 0 && r.delta_ppl_err == 0); /* no base: nothing paired */
        }
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

/* the paired per-chunk ΔPPL statistics against a hand computation: chunks of 3 positions, two
 * with NLL differences averaging 0.1, -0.05, 0.2 and one where the base row floors the token
 * (the candidate is floored the same way: it adds nothing) */
TEST(delta_ppl_paired_se) {
    qf_kld_state k;
    memset(&k, 0, sizeof k);
    k.reading = true, k.n_chunk = 3, k.n_score = 3;
    k.kld_values = calloc(9, sizeof(float));
    double d[3] = {0.1, -0.05, 0.2};
    for (int c = 0; c < 3; c++) {
        qf_kld_pos pos[3] = {{.nll = (float)(2.0 + d[c] + 0.25), .nll_base = 2.0f, .nll_floor = 20.0f, .kl = 0.01},
                             {.nll = (float)(3.0 + d[c] - 0.25), .nll_base = 3.0f, .nll_floor = 21.0f, .kl = 0.02},
                             {.nll = 25.0f + (float)c, .nll_base = 20.0f, .nll_floor = 20.0f, .kl = 0.5}};
        qf_kld_accumulate(&k, pos, 3);
        d[c] *= 2.0 / 3; /* the chunk's mean over its 3 positions */
    }
    qf_ppl_result r;
    memset(&r, 0, sizeof r);
    CHECK(qf_kld_finish(&k, &r, NULL) == QF_OK);
    double md = (d[0] + d[1] + d[2]) / 3, sd = sqrt((pow(d[0] - md, 2) + pow(d[1] - md, 2) + pow(d[2] - md, 2)) / 2);
    CHECK_MSG(fabs(r.delta_ppl - expm1(md)) < 1e-6, "%g vs %g", r.delta_ppl, expm1(md));
    CHECK_MSG(fabs(r.delta_ppl_err - exp(md) * sd / sqrt(3)) < 1e-6, "%g vs %g", r.delta_ppl_err, exp(md) * sd / sqrt(3));
    qf_kld_end(&k);
}

/* the KL rows of a chunk over a thread pool: the encoded base rows (writing) and each position's
 * statistics (reading) are the same bytes with 1 and 3 threads, and a damaged base row is
 * reported as the first one, as one thread finds it */
TEST(kld_rows_thread_invariant) {
    const int n_vocab = 1001, n = 31;
    qf_kld_state k;
    memset(&k, 0, sizeof k);
    k.n_vocab = n_vocab, k.nv = 2 * ((n_vocab + 1) / 2) + 4, k.n_chunk = 1, k.n_score = n;
    float *lg = malloc(sizeof(float) * (size_t)n * n_vocab), *lg2 = malloc(sizeof(float) * (size_t)n * n_vocab);
    uint16_t *ra = calloc((size_t)n * k.nv, 2), *rb = calloc((size_t)n * k.nv, 2);
    int32_t next[31];
    qf_kld_pos pa[31], pb[31];
    qf_pool *pool = qf_pool_create(3);
    CHECK(lg && lg2 && ra && rb && pool);
    uint64_t st = 7;
    for (size_t i = 0; i < (size_t)n * n_vocab; i++) {
        lg[i] = (float)((qf_splitmix64(&st) >> 40) % 20000) / 1000.0f - 10.0f;
        lg2[i] = lg[i] + (float)((qf_splitmix64(&st) >> 40) % 1000) / 2000.0f;
    }
    for (int i = 0; i < n; i++) next[i] = (int32_t)(qf_splitmix64(&st) % (uint64_t)n_vocab);
    k.writing = true;
    CHECK(qf_kld_chunk(&k, lg, next, n, 0, ra, NULL, NULL, NULL) == QF_OK);
    CHECK(qf_kld_chunk(&k, lg, next, n, 0, rb, NULL, pool, NULL) == QF_OK);
    CHECK(memcmp(ra, rb, (size_t)n * k.nv * 2) == 0);
    k.writing = false, k.reading = true;
    k.in_rows = (const uint8_t *)ra, k.in_rows_len = (size_t)n * k.nv * 2;
    memset(pa, 0, sizeof pa), memset(pb, 0xff, sizeof pb);
    CHECK(qf_kld_chunk(&k, lg2, next, n, 0, NULL, pa, NULL, NULL) == QF_OK);
    CHECK(qf_kld_chunk(&k, lg2, next, n, 0, NULL, pb, pool, NULL) == QF_OK);
    for (int i = 0; i < n; i++) /* field by field: the struct's padding is not compared */
        CHECK(memcmp(&pa[i].nll, &pb[i].nll, 4) == 0 && memcmp(&pa[i].nll_base, &pb[i].nll_base, 4) == 0 &&
              memcmp(&pa[i].pd, &pb[i].pd, 4) == 0 && memcmp(&pa[i].nll_floor, &pb[i].nll_floor, 4) == 0 &&
              pa[i].same_top == pb[i].same_top && memcmp(&pa[i].kl, &pb[i].kl, 8) == 0);
    CHECK(pa[3].kl > 0 && isfinite(pa[3].kl));
    /* rows 17 and 5 damaged: row 5 is named, whoever computed it */
    float nan = NAN;
    memcpy((uint8_t *)ra + (size_t)17 * k.nv * 2, &nan, 4);
    memcpy((uint8_t *)ra + (size_t)5 * k.nv * 2 + 4, &nan, 4);
    for (int t = 0; t < 2; t++) {
        qf_error e = {0};
        CHECK(qf_kld_chunk(&k, lg2, next, n, 0, NULL, pb, t ? pool : NULL, &e) == QF_ERR_FORMAT);
        CHECK_MSG(strstr(e.msg, "row 5 of block 0") != NULL, "%s", e.msg);
    }
    qf_pool_free(pool);
    free(lg), free(lg2), free(ra), free(rb);
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

/* ---- the entropy-coded int8 row ("ec-rot"), against an oracle written from the layout in
 * kv_codes.c: read one bit at a time, no buffering ---- */
typedef struct {
    const uint8_t *p;
    int n_bits, pos;
} obits;

static int obit(obits *b) {
    if (b->pos >= b->n_bits) return b->pos++, 0;
    int v = (b->p[b->pos >> 3] >> (b->pos & 7)) & 1;
    b->pos++;
    return v;
}

static unsigned otake(obits *b, int k) {
    unsigned v = 0;
    for (int i = 0; i < k; i++) v |= (unsigned)obit(b) << i;
    return v;
}

/* decode; returns the exponent (0: zero row) and the bits used, -1 when the row overruns */
static int oracle_ec_decode(const uint8_t *q, int n, float *x, int *used) {
    obits b = {q, 8 * n, 0};
    int e = (int)otake(&b, 10);
    float d = exp2f((float)(e - 704) / 32.0f); /* the step, in float as the cache computes it */
    for (int i = 0; i < n; i++) {
        unsigned h;
        if (!obit(&b)) h = (unsigned)obit(&b);
        else {
            h = 2 + otake(&b, 2);
            if (h == 5)
                while (obit(&b) && b.pos <= b.n_bits) h++;
        }
        unsigned c = h << 4 | otake(&b, 4);
        int neg = obit(&b);
        float v = (float)c * d;
        x[i] = e ? (neg ? -v : v) : 0.0f;
    }
    *used = b.pos;
    return b.pos > b.n_bits ? -1 : e;
}

/* bits a row takes at exponent e, by the layout's code lengths (the oracle of the rate) */
static long oracle_ec_bits(const float *x, int n, int e) {
    double d = exp2((e - 704) / 32.0);
    long bits = 10;
    for (int i = 0; i < n; i++) {
        double v = fabs((double)x[i]) / d;
        long c = isfinite(v) ? (long)(v + 0.5) : 0;
        if (c > 1023) return 1L << 40;
        long h = c >> 4;
        bits += 5 + (h < 2 ? 2 : h < 5 ? 3 : h - 1);
    }
    return bits;
}

static double gauss(uint64_t *s) {
    double u = ((qf_xorshift64s(s) >> 11) + 1) * 0x1.0p-53, v = (qf_xorshift64s(s) >> 11) * 0x1.0p-53;
    return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

/* the encoder's rows decode by the oracle to what the codec decodes, within half a step of the
 * input, at the finest step that fits (one step finer overflows the row); on Gaussian rows
 * (what rotated K/V rows look like) the error is well below the parity-carried layout's */
TEST(int8_ec_codec) {
    uint64_t s = 7;
    uint8_t q[1024];
    int8_t qt[1024];
    float x[1024], y[1024], yo[1024];
    double se_ec = 0, se_tok = 0;
    for (int trial = 0; trial < 300; trial++) {
        int n = trial % 3 == 0 ? 64 : trial % 3 == 1 ? 128 : 16 << (trial % 7);
        if (n > 1024) n = 1024;
        double mag = exp2((double)(trial % 31) - 16); /* rows of RMS 2^-16 .. 2^14: within the step range */
        for (int i = 0; i < n; i++) x[i] = (float)(mag * (trial % 5 == 4 ? (qf_xorshift64s(&s) >> 11) * 0x1.0p-53 - 0.5 : gauss(&s)));
        qf_kv_int8_ec_quantize(x, q, n);
        qf_kv_int8_ec_dequantize(q, n, y, n);
        int used = 0, e = oracle_ec_decode(q, n, yo, &used);
        CHECK_MSG(e > 0, "trial %d: exponent %d (bits used %d of %d)", trial, e, used, 8 * n);
        if (e <= 0) continue;
        double d = exp2((e - 704) / 32.0), se = 0;
        for (int i = 0; i < n; i++) {
            CHECK_MSG(y[i] == yo[i], "trial %d: element %d: codec %g, oracle %g", trial, i, y[i], yo[i]);
            CHECK_MSG(fabs(x[i] - y[i]) <= 0.5001 * d, "trial %d: element %d: error %g, step %g", trial, i, fabs(x[i] - y[i]), d);
            se += (double)(x[i] - y[i]) * (x[i] - y[i]);
        }
        CHECK_EQ_INT(oracle_ec_bits(x, n, e) == used, 1);
        if (trial % 10 == 1) { /* a prefix decodes alone to the same values */
            float yp[1024];
            int np = n / 2 + 3;
            qf_kv_int8_ec_dequantize(q, n, yp, np);
            for (int i = 0; i < np; i++) CHECK(yp[i] == y[i]);
        }
        CHECK_MSG(e == 1 || oracle_ec_bits(x, n, e - 1) > 8L * n, "trial %d: e %d is not the finest step that fits", trial, e);
        if (n == 128 && trial % 5 != 4 && trial % 31 >= 8 && trial % 31 <= 24) {
            qf_kv_int8_token_quantize(x, qt, n);
            qf_kv_int8_token_dequantize(qt, yo, n);
            double st = 0;
            for (int i = 0; i < n; i++) st += (double)(x[i] - yo[i]) * (x[i] - yo[i]);
            se_ec += se / (mag * mag), se_tok += st / (mag * mag);
        }
    }
    printf("  Gaussian rows of 128: ec / token-rot squared error %.3f\n", se_ec / se_tok);
    CHECK_MSG(se_ec < 0.7 * se_tok, "ec %g vs token %g", se_ec, se_tok);
    /* the zero row, non-finite elements, values beyond the step range, a corrupt row */
    memset(x, 0, sizeof x);
    qf_kv_int8_ec_quantize(x, q, 64);
    for (int i = 0; i < 64; i++) CHECK(q[i] == 0);
    qf_kv_int8_ec_dequantize(q, 64, y, 64);
    for (int i = 0; i < 64; i++) CHECK(y[i] == 0);
    x[3] = NAN, x[4] = INFINITY, x[5] = 1.0f, x[6] = -0.5f;
    qf_kv_int8_ec_quantize(x, q, 64);
    qf_kv_int8_ec_dequantize(q, 64, y, 64);
    for (int i = 0; i < 64; i++) CHECK(isfinite(y[i]));
    CHECK(y[3] == 0 && y[4] == 0 && fabsf(y[5] - 1.0f) < 0.02f && fabsf(y[6] + 0.5f) < 0.02f);
    for (int i = 0; i < 64; i++) x[i] = (i % 2 ? 1e30f : -1e30f);
    qf_kv_int8_ec_quantize(x, q, 64);
    qf_kv_int8_ec_dequantize(q, 64, y, 64);
    int used = 0;
    CHECK(oracle_ec_decode(q, 64, yo, &used) > 0 && used <= 512); /* capped codes, still fits */
    for (int i = 0; i < 64; i++) CHECK(isfinite(y[i]) && y[i] == yo[i] && (y[i] < 0) == (x[i] < 0));
    memset(q, 0xff, 64); /* all ones: an endless unary tail; decodes to finite values, no overrun */
    y[63] = 7;
    qf_kv_int8_ec_dequantize(q, 64, y, 64);
    for (int i = 0; i < 64; i++) CHECK(isfinite(y[i]));
    CHECK(y[63] == 0);
}

/* the decoder's 64-bit window gives the one-bit-at-a-time reference's values on encoded rows
 * (Gaussian, uniform, heavy-tailed: long unary tails) and on random bytes (corrupt rows: tails
 * that run past the row, rows that run out of bits), whole and as prefixes */
TEST(int8_ec_decoder_matches_reference) {
    uint64_t s = 23;
    static uint8_t q[1024], q4[4][1024];
    static float x[1024], y0[1024], y1[1024], z4[4][1024];
    int bad = 0, rows = 0, bad4 = 0, rows4 = 0;
    static const int ns[] = {16, 24, 64, 128, 256, 1024};
    for (int trial = 0; trial < 600; trial++) {
        int n = ns[trial % 6], kind = trial / 6 % 4;
        if (kind < 3) {
            for (int i = 0; i < n; i++) {
                double g = gauss(&s);
                x[i] = (float)(kind == 0 ? g : kind == 1 ? (double)(qf_xorshift64s(&s) >> 11) * 0x1.0p-53 - 0.5 : g * g * g * g * g);
            }
            qf_kv_int8_ec_quantize(x, q, n);
        } else {
            for (int i = 0; i < n; i++) q[i] = (uint8_t)qf_xorshift64s(&s);
            if (trial % 12 == 3) memset(q + n / 2, 0xff, (size_t)n / 2); /* an endless tail */
        }
        int n_out = trial % 5 == 0 ? n / 2 + 1 : n;
        for (int i = 0; i < n; i++) y0[i] = y1[i] = -1.0f;
        qf_kv_int8_ec_dequantize_ref(q, n, y0, n_out);
        qf_kv_int8_ec_dequantize(q, n, y1, n_out);
        bad += memcmp(y0, y1, sizeof(float) * (size_t)n) != 0, rows++;
    }
    for (int trial = 0; trial < 240; trial++) { /* four rows side by side, of kinds mixed as above */
        int n = ns[trial % 6], n_out = trial % 5 == 0 ? n / 2 + 1 : n;
        for (int r = 0; r < 4; r++) {
            int kind = (trial + r) % 4;
            if (kind < 3) {
                for (int i = 0; i < n; i++) {
                    double g = gauss(&s);
                    x[i] = (float)(kind == 0 ? g : kind == 1 ? (double)(qf_xorshift64s(&s) >> 11) * 0x1.0p-53 - 0.5 : g * g * g * g * g);
                }
                qf_kv_int8_ec_quantize(x, q4[r], n);
            } else {
                for (int i = 0; i < n; i++) q4[r][i] = (uint8_t)qf_xorshift64s(&s);
                if (trial % 8 == 3) memset(q4[r] + n / 2, 0xff, (size_t)n / 2);
            }
            memset(z4[r], 0xff, sizeof z4[r]);
        }
        if (trial % 7 == 2) memset(q4[1], 0, 2); /* a zero row among them */
        const uint8_t *rq[4] = {q4[0], q4[1], q4[2], q4[3]};
        float *const ro[4] = {z4[0], z4[1], z4[2], z4[3]};
        qf_kv_int8_ec_dequantize4(rq, n, ro, n_out);
        for (int r = 0; r < 4; r++) {
            for (int i = 0; i < n; i++) y0[i] = -1.0f;
            qf_kv_int8_ec_dequantize_ref(q4[r], n, y0, n_out);
            bad4 += memcmp(y0, z4[r], sizeof(float) * (size_t)n_out) != 0, rows4++;
        }
    }
    printf("  %d rows, %d differ from the reference; four at a time: %d rows, %d differ\n", rows, bad, rows4, bad4);
    CHECK_EQ_INT(bad4, 0);
    CHECK_EQ_INT(bad, 0);
}

/* append the nb low bits of v to the LSB-first stream q at bit *pos (q zeroed) */
static void ec_test_put(uint8_t *q, size_t *pos, uint32_t v, int nb) {
    for (int k = 0; k < nb; k++, (*pos)++)
        if ((v >> k) & 1) q[*pos >> 3] |= (uint8_t)(1u << (*pos & 7));
}

/* one ec row of n bytes of kind k: 0 Gaussian, 1 uniform, 2 heavy-tailed (g^5), 3 Gaussian
 * with a few outliers 40x, all through the encoder; 4 random bytes (a corrupt row), 5 random
 * bytes then 0xff from n/2 (an endless unary tail), 6 all 0xff, 7 a zero row (e = 0, the rest
 * random), 8 a well-formed stream written here with many long codes (h up to 63: codes of up
 * to 67 bits, past any 32- or 64-bit window) among short ones, zero padding after */
static void ec_test_row(int kind, uint8_t *q, int n, uint64_t *s) {
    static float x[1024];
    if (kind < 4) {
        for (int i = 0; i < n; i++) {
            double g = gauss(s);
            x[i] = (float)(kind == 0   ? g
                           : kind == 1 ? (double)(qf_xorshift64s(s) >> 11) * 0x1.0p-53 - 0.5
                           : kind == 2 ? g * g * g * g * g
                                       : (qf_xorshift64s(s) % 29 == 0 ? 40 * g : g));
        }
        qf_kv_int8_ec_quantize(x, q, n);
    } else if (kind < 8) {
        for (int i = 0; i < n; i++) q[i] = kind == 6 ? 0xff : (uint8_t)qf_xorshift64s(s);
        if (kind == 5) memset(q + n / 2, 0xff, (size_t)n / 2);
        if (kind == 7) q[0] = 0, q[1] &= 0xfc;
    } else {
        memset(q, 0, (size_t)n);
        size_t pos = 0, total = (size_t)n * 8;
        ec_test_put(q, &pos, 1 + (uint32_t)(qf_xorshift64s(s) % 1023), 10);
        for (;;) {
            uint64_t u = qf_xorshift64s(s);
            uint32_t h = u % 3 ? (uint32_t)(u >> 8) % 7 : 7 + (uint32_t)(u >> 8) % 57, lo = (uint32_t)(u >> 20) & 15;
            int len = h < 2 ? 2 : h < 5 ? 3 : (int)h - 1;
            if (pos + (size_t)len + 5 > total) break;
            if (h < 2) ec_test_put(q, &pos, h << 1, 2);
            else if (h < 5) ec_test_put(q, &pos, 1u | ((h - 2) & 1) << 1 | ((h - 2) >> 1) << 2, 3);
            else {
                ec_test_put(q, &pos, 7u, 3);
                for (uint32_t k = 5; k < h; k++) ec_test_put(q, &pos, 1u, 1);
                ec_test_put(q, &pos, 0u, 1);
            }
            ec_test_put(q, &pos, lo, 4);
            ec_test_put(q, &pos, (uint32_t)(u >> 30) & 1, 1);
        }
    }
}

/* qf_kv_int8_ec_dequantize16 (16 or 32 rows side by side: the AVX-512 lanes where the CPU has
 * them, else four-row calls; both run here) gives the reference's floats bit for bit on every
 * lane, for rows of every kind ec_test_row makes, one kind for all rows or mixed (one bad lane
 * must not spoil the others), at several lengths and row strides, for prefixes n_out < n, and
 * writes nothing at or past n_out. The rows are one mapping whose last row ends where an
 * unreadable page begins, so a read past it faults. */
TEST(int8_ec_decoder16_matches_reference) {
    uint64_t s = 77;
    static const int ns[] = {16, 24, 64, 128, 136, 256, 520, 1024};
    static float y[32][1024 + 8], ref[1024 + 8];
    const bool simd = qf_kv_int8_ec16_fast();
    if (simd) printf("  16-row AVX-512 kernel: on (the four-row fallback checked too)\n");
    else printf("  16-row AVX-512 kernel: SKIPPED, off here (no AVX-512 F/BW/VL/VNNI, or QF_GEMM_ISA caps it; the four-row fallback checked)\n");
    int rows = 0, bad = 0, spill = 0;
    for (int pass = 0; pass < 2; pass++) { /* pass 0: the kernel (if any); pass 1: the fallback */
        if (pass == 1) qf_gemm_cap_isa(QF_GEMM_ISA_AVX2);
        CHECK(pass == 0 || !qf_kv_int8_ec16_fast());
        for (int trial = 0; trial < 480; trial++) {
            const int n = ns[trial % 8], extra = 8 * (trial / 8 % 3);
            const size_t stride = (size_t)n + (size_t)extra;
            const int nos[] = {n, n, n / 2 + 1, 1, 17, n - 1, n + 5, 0};
            const int n_out = nos[trial / 24 % 8], n_cmp = n_out < n ? n_out : n;
            const int nr = trial % 2 ? 32 : 16;
            /* the last row ends at a page that may not be read (a gather past it faults: ASan
             * does not see the kernel's gathers) */
            const size_t len = (size_t)(nr - 1) * stride + (size_t)n, pg = 4096, span = (len + pg - 1) / pg * pg;
            uint8_t *map = mmap(NULL, span + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (map == MAP_FAILED || mprotect(map + span, pg, PROT_NONE)) {
                CHECK(!"mmap");
                return;
            }
            uint8_t *buf = map + span - len;
            for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)qf_xorshift64s(&s);
            const int same = trial % 3 == 0 ? (int)(qf_xorshift64s(&s) % 9) : -1;
            for (int r = 0; r < nr; r++)
                ec_test_row(same >= 0 ? same : (int)(qf_xorshift64s(&s) % 9), buf + r * stride, n, &s);
            float *out[32];
            for (int r = 0; r < nr; r++) {
                out[r] = y[r];
                for (int i = 0; i < 1024 + 8; i++) y[r][i] = -7.0f;
            }
            qf_kv_int8_ec_dequantize16(buf, stride, n, nr, out, n_out);
            for (int r = 0; r < nr; r++) {
                qf_kv_int8_ec_dequantize_ref(buf + r * stride, n, ref, n_out);
                bad += memcmp(ref, y[r], sizeof(float) * (size_t)(n_cmp > 0 ? n_cmp : 0)) != 0, rows++;
                for (int i = n_cmp > 0 ? n_cmp : 0; i < 1024 + 8; i++) spill += y[r][i] != -7.0f;
            }
            munmap(map, span + pg);
        }
        qf_gemm_cap_isa(QF_GEMM_ISA_AVX512);
    }
    printf("  %d rows 16 or 32 at a time, %d differ from the reference, %d values written past n_out\n", rows, bad, spill);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(spill, 0);
}

/* a buffer of nr rows (stride apart, n bytes each) of random ec kinds (ec_test_row), the last
 * row ending at a page that may not be read (a gather past it faults); *map_out / *span_out for
 * munmap. NULL on failure. */
static uint8_t *ec_test_rows(int nr, size_t stride, int n, uint64_t *s, uint8_t **map_out, size_t *span_out) {
    const size_t len = (size_t)(nr - 1) * stride + (size_t)n, pg = 4096, span = (len + pg - 1) / pg * pg;
    uint8_t *map = mmap(NULL, span + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return NULL;
    if (mprotect(map + span, pg, PROT_NONE)) {
        munmap(map, span + pg);
        return NULL;
    }
    uint8_t *buf = map + span - len;
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)qf_xorshift64s(s);
    const int same = qf_xorshift64s(s) % 3 == 0 ? (int)(qf_xorshift64s(s) % 9) : -1;
    for (int r = 0; r < nr; r++) ec_test_row(same >= 0 ? same : (int)(qf_xorshift64s(s) % 9), buf + r * stride, n, s);
    *map_out = map, *span_out = span + pg;
    return buf;
}

/* qf_kv_int8_ec_dequantize16_seg (the rows' elements from skip on stored in segments: a group
 * row's heads straight into their f32 views) against the reference: every element in its place,
 * nothing else written (elements before skip included), with the kernel and the four-row
 * fallback; seg multiples of 16 (the kernel) and not (scratch), one segment and several */
TEST(int8_ec_decoder16_seg_matches_reference) {
    uint64_t s = 91;
    static const int hds[] = {16, 32, 64, 128, 256, 24, 40};
    static float ref[1024], dst[4][32 * 264 + 64];
    int rows = 0, bad = 0, spill = 0;
    for (int pass = 0; pass < 2; pass++) { /* pass 0: the kernel (if any); pass 1: the fallback */
        if (pass == 1) qf_gemm_cap_isa(QF_GEMM_ISA_AVX2);
        for (int trial = 0; trial < 280; trial++) {
            const int hd = hds[trial % 7], g = 1 + trial / 7 % 4, nr = trial % 2 ? 32 : 16;
            if (g * hd > 1024) continue;
            const int n = g * hd, k0 = (int)(qf_xorshift64s(&s) % (uint64_t)g), k1 = k0 + 1 + (int)(qf_xorshift64s(&s) % (uint64_t)(g - k0));
            const size_t stride = (size_t)n + (size_t)(8 * (trial / 3 % 3));
            uint8_t *map;
            size_t span;
            const uint8_t *buf = ec_test_rows(nr, stride, n, &s, &map, &span);
            if (!buf) {
                CHECK(!"mmap");
                return;
            }
            /* head k of row r at dst[k][r * (hd + 8)]: the row stride is not hd, so misplaced values show */
            const size_t rs = (size_t)hd + 8;
            for (int k = 0; k < 4; k++)
                for (size_t i = 0; i < sizeof dst[0] / sizeof(float); i++) dst[k][i] = -7.0f;
            float *out[32];
            for (int r = 0; r < nr; r++) out[r] = dst[0] + (size_t)r * rs;
            qf_kv_int8_ec_dequantize16_seg(buf, stride, n, nr, out, k1 * hd, k0 * hd, hd, (size_t)(dst[1] - dst[0]));
            for (int r = 0; r < nr; r++) {
                qf_kv_int8_ec_dequantize_ref(buf + r * stride, n, ref, k1 * hd);
                for (int k = k0; k < k1; k++)
                    bad += memcmp(ref + (size_t)k * hd, dst[k - k0] + (size_t)r * rs, sizeof(float) * (size_t)hd) != 0;
                rows++;
            }
            for (int k = 0; k < 4; k++)
                for (size_t i = 0; i < sizeof dst[0] / sizeof(float); i++) {
                    const bool mine = k < k1 - k0 && i < (size_t)nr * rs && i % rs < (size_t)hd;
                    spill += !mine && dst[k][i] != -7.0f;
                }
            munmap(map, span);
        }
        qf_gemm_cap_isa(QF_GEMM_ISA_AVX512);
    }
    printf("  %d rows in segments, %d differ from the reference, %d values written elsewhere\n", rows, bad, spill);
    CHECK(rows > 0);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(spill, 0);
}

/* qf_kv_int8_ec_dot16 (rows decoded and scored against queries without being stored) against
 * qf_kv_int8_ec_dot_ref bit for bit: 16 and 32 rows, 1-4 segments of 16-256 elements (and of
 * 24 / 40: not the kernel's), 1-8 queries a segment, every ec row kind (long tails, corrupt and
 * zero rows among them), the kernel and the fallback; nothing written outside y's entries */
TEST(int8_ec_dot16_matches_reference) {
    uint64_t s = 123;
    static const int segs[] = {16, 32, 64, 128, 256, 24, 40};
    static float qv[8 * 8 * 256], y[64 * 40], yr[64 * 40];
    for (size_t i = 0; i < sizeof qv / sizeof(float); i++) qv[i] = (float)gauss(&s);
    int rows = 0, bad = 0, spill = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) qf_gemm_cap_isa(QF_GEMM_ISA_AVX2);
        for (int trial = 0; trial < 336; trial++) {
            const int seg = segs[trial % 7], nseg = 1 + trial / 7 % 4, nq = 1 + trial / 28 % 8, nr = trial % 2 ? 32 : 16;
            if (nseg * seg > 1024) continue;
            /* the rows may hold more than is read (ec_test_row: n <= 1024) */
            const int n = nseg * seg + (nseg * seg <= 1024 - 16 ? trial / 5 % 2 * 16 : 0);
            const size_t stride = (size_t)n + (size_t)(8 * (trial / 3 % 3)), qs = (size_t)seg + 4, ys = 40;
            uint8_t *map;
            size_t span;
            const uint8_t *buf = ec_test_rows(nr, stride, n, &s, &map, &span);
            if (!buf) {
                CHECK(!"mmap");
                return;
            }
            for (int i = 0; i < 64 * 40; i++) y[i] = yr[i] = -7.0f;
            qf_kv_int8_ec_dot16(buf, stride, n, nr, nseg, seg, qv, nq, qs, y, ys);
            qf_kv_int8_ec_dot_ref(buf, stride, n, nr, nseg, seg, qv, nq, qs, yr, ys);
            for (int o = 0; o < nseg * nq; o++) bad += memcmp(y + (size_t)o * ys, yr + (size_t)o * ys, sizeof(float) * (size_t)nr) != 0;
            for (int i = 0; i < 64 * 40; i++) spill += ((size_t)i / ys >= (size_t)(nseg * nq) || (size_t)i % ys >= (size_t)nr) && y[i] != -7.0f;
            rows += nr;
            munmap(map, span);
        }
        qf_gemm_cap_isa(QF_GEMM_ISA_AVX512);
    }
    printf("  %d rows scored, %d (segment, query) columns differ from the reference, %d values written elsewhere\n", rows, bad, spill);
    CHECK(rows > 0);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(spill, 0);
}

/* qf_kv_int8_ec_wsum16 (the rows weighted and summed as they are decoded: a one-token step's V)
 * against its oracle qf_kv_int8_ec_wsum_ref, with the kernel (lane sums, then
 * qf_kv_int8_ec_wsum_fold) and the four-row fallback, for rows of every kind ec_test_row makes
 * (rows the lanes leave finished by the scalar steps), 16 and 32 rows, several segment widths and
 * queries: each sum within 1e-5 of the sum of its terms' magnitudes (a reordered f32 sum of at
 * most 32 terms; measured: printed), the lane sums zero after the fold, nothing else written */
TEST(int8_ec_wsum16_matches_reference) {
    uint64_t s = 321;
    static const int segs[] = {16, 32, 64, 128, 256};
    static float w[8 * 4 * 40], y[32 * 264], yr[32 * 264], mag[32 * 264], row[1024];
    const size_t acc_n = (size_t)8 * 1024 * 16;
    float *acc = qf_malloc_aligned(acc_n * sizeof(float));
    CHECK(acc != NULL);
    if (!acc) return;
    memset(acc, 0, acc_n * sizeof(float));
    for (size_t i = 0; i < sizeof w / sizeof(float); i++) w[i] = (float)(qf_rand_unit(&s) * (qf_rand_unit(&s) < 0.1 ? 0 : 1));
    int rows = 0, bad = 0, spill = 0, accbad = 0;
    double worst = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) qf_gemm_cap_isa(QF_GEMM_ISA_AVX2);
        for (int trial = 0; trial < 240; trial++) {
            const int seg = segs[trial % 5], nseg = 1 + trial / 5 % 4, nq = 1 + trial / 20 % 8, nr = trial % 2 ? 32 : 16;
            if (nseg * seg > 1024 || nseg * nq > 32) continue;
            const int n = nseg * seg + (nseg * seg <= 1024 - 16 ? trial / 3 % 2 * 16 : 0);
            const size_t stride = (size_t)n + (size_t)(8 * (trial / 7 % 3)), ws = 40, ys = (size_t)seg + 8;
            uint8_t *map;
            size_t span;
            const uint8_t *buf = ec_test_rows(nr, stride, n, &s, &map, &span);
            if (!buf) {
                CHECK(!"mmap");
                break;
            }
            for (int i = 0; i < 32 * 264; i++) y[i] = yr[i] = 0.25f, mag[i] = 0.25f;
            qf_kv_int8_ec_wsum16(buf, stride, n, nr, nseg, seg, w, nq, ws, acc, y, ys);
            qf_kv_int8_ec_wsum_fold(acc, nseg, seg, nq, y, ys);
            qf_kv_int8_ec_wsum_ref(buf, stride, n, nr, nseg, seg, w, nq, ws, yr, ys);
            for (int r = 0; r < nr; r++) { /* each sum's terms' magnitudes */
                qf_kv_int8_ec_dequantize_ref(buf + (size_t)r * stride, n, row, nseg * seg);
                for (int o = 0; o < nseg * nq; o++)
                    for (int e = 0; e < seg; e++)
                        mag[(size_t)o * ys + e] += fabsf(w[(size_t)o * ws + r] * row[(o / nq) * seg + e]);
            }
            for (int o = 0; o < nseg * nq; o++)
                for (int e = 0; e < seg; e++) {
                    const size_t i = (size_t)o * ys + e;
                    if (!isfinite(mag[i])) { /* a corrupt row's huge values: both not finite, or equal */
                        bad += isfinite(y[i]) != isfinite(yr[i]);
                        continue;
                    }
                    const double rel = fabs((double)y[i] - yr[i]) / mag[i];
                    worst = fmax(worst, rel);
                    bad += !(rel <= 1e-5);
                }
            for (int i = 0; i < 32 * 264; i++) spill += ((size_t)i / ys >= (size_t)(nseg * nq) || (size_t)i % ys >= (size_t)seg) && y[i] != 0.25f;
            for (size_t i = 0; i < acc_n; i++) accbad += acc[i] != 0;
            rows += nr;
            munmap(map, span);
        }
        qf_gemm_cap_isa(QF_GEMM_ISA_AVX512);
    }
    printf("  %d rows summed, max |sum - reference| %.2e of the terms' magnitudes, %d sums out of 1e-5, %d values written "
           "elsewhere, %d lane sums left nonzero\n",
           rows, worst, bad, spill, accbad);
    free(acc);
    CHECK(rows > 0);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(spill, 0);
    CHECK_EQ_INT(accbad, 0);
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
    for (int lay = 0; lay < QF_KV_INT8_LAYOUT_COUNT; lay++) {
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
    { /* ec-rot at head_dim 512: two heads exceed one 256-element group, so one head per row */
        qf_hparams h5 = hp_with(512);
        float *sc5 = malloc(sizeof(float) * 2 * 2 * 512), *src5 = malloc(sizeof(float) * 2 * 512);
        float *got5 = malloc(sizeof(float) * 3 * 512);
        for (int i = 0; i < 2 * 2 * 512; i++) sc5[i] = 1.0f;
        for (int i = 0; i < 2 * 512; i++) src5[i] = (float)(((qf_xorshift64s(&s) >> 11) * 0x1.0p-53) * 2 - 1);
        qf_kv_stream_spec sp5[2] = {{.mode = QF_KV_INT8, .int8_scale = sc5, .int8_layout = QF_KV_INT8_EC_ROT},
                                    {.mode = QF_KV_F16}};
        CHECK_MSG(qf_kv_cache_init_spec(&kv, &h5, 4, sp5, &e) == QF_OK, "%s", e.msg);
        qf_kv_cache_write(&kv, 0, 0, 2, 1, src5); /* position 2 */
        for (int h = 0; h < 2; h++) {
            qf_kv_cache_read_head(&kv, 0, 0, h, 3, got5);
            double maxd = 0;
            for (int d = 0; d < 512; d++) maxd = fmax(maxd, fabs(src5[h * 512 + d] - got5[2 * 512 + d]));
            CHECK_MSG(maxd < 0.03, "head %d: max error %g", h, maxd); /* step ~0.01 */
        }
        qf_kv_cache_free(&kv);
        free(sc5), free(src5), free(got5);
    }
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
    sp[0].int8_layout = QF_KV_INT8_EC_ROT; /* entropy-coded rows are rotated: a power of two */
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 8, sp, &e), QF_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "entropy-coded") && strstr(e.msg, "power of two in [16, 1024]"));
    hp = hp_with(8); /* a power of two, but too short for the 10-bit header and the codes */
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 8, sp, &e), QF_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "entropy-coded") != NULL);
    hp = hp_with(96);
    sp[0].int8_layout = 9;
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 8, sp, &e), QF_ERR_ARG);
}

/* a kv-int8 payload names its row layouts: "ec-rot" binds, an unknown name is a corrupt
 * artifact (nothing bound) */
TEST(int8_layout_payload) {
    qf_model *m = demo();
    if (!m) SKIP("demo model not in ../shared/data");
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 32, cp.n_threads = 1, cp.device = QF_DEVICE_CPU;
    qf_error e = {0};
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK_MSG(c != NULL, "%s", e.msg);
    if (c) {
        const qf_hparams *hp = qf_model_hparams(m);
        int64_t shape[2] = {hp->n_layer, hp->n_head_kv};
        float *s = malloc(sizeof(float) * hp->n_layer * hp->n_head_kv);
        for (int i = 0; i < hp->n_layer * hp->n_head_kv; i++) s[i] = 1.0f;
        for (int bad = 0; bad < 2; bad++) {
            qf_payload pl = {0};
            CHECK(qf_payload_add_f32(&pl, "k_scale", s, 2, shape, &e) == QF_OK);
            CHECK(qf_payload_add_f32(&pl, "v_scale", s, 2, shape, &e) == QF_OK);
            CHECK(qf_payload_add_string(&pl, "k_layout", "ec-rot", &e) == QF_OK);
            CHECK(qf_payload_add_string(&pl, "v_layout", bad ? "ec-rotated" : "ec-rot", &e) == QF_OK);
            qf_status st = qf_context_bind_payload(c, QF_ARTIFACT_KV_INT8, &pl, &e);
            if (bad) {
                CHECK_EQ_INT(st, QF_ERR_ARTIFACT_CORRUPT);
                CHECK(strstr(e.msg, "v_layout") && strstr(e.msg, "\"ec-rot\""));
                CHECK(!qf_context_bound(c, NULL));
            } else {
                CHECK_MSG(st == QF_OK, "%s", e.msg);
                CHECK(c->kv.int8_layout[0] == QF_KV_INT8_EC_ROT && c->kv.int8_layout[1] == QF_KV_INT8_EC_ROT);
                CHECK(qf_context_unbind(c, &e) == QF_OK);
            }
            qf_payload_free(&pl);
        }
        free(s);
    }
    qf_context_free(c);
    qf_model_free(m);
}

/* The CPU's fast route attends rows stored rotated (--kv-rot; kv-int8 static-rot, token-rot,
 * ec-rot) in their basis (forward.c, att_job.rotk / rotv: H q against the stored H k, the output
 * rotated back from the stored H v) instead of rotating every cached row back on each read. Against the rotate-on-read route (QF_NO_ROTQ, read at context creation) on the
 * same tokens, a 40-token prompt then 8 decode steps, 1 and 3 threads. The prompt's logits of
 * an f32 cache agree to f32 rounding (2e-6 of the largest). Elsewhere a rounding difference can
 * cross a boundary and grow: in decode the matvecs round the activation to f16 (ggml's F16
 * activation), and q4_0 / q8_0 quantize the next layer's K and V; so all rows agree to 5e-3 of
 * the largest logit (measured: 3.5e-3 / 6.5e-3 / 2.0e-2 of 14.9 for f32 / q4_0 / q8_0). The
 * canonical route ignores the switch (the same bits). */
/* The logits of positions 0..n-1 in context c (freed here): a np-token prompt, then the rest
 * one at a time (alt false) or in batches of 1, 2, 1, 2, ... (alt); ok false: c is only freed.
 * NULL on any failure (said on stderr, with *e's message). */
static float *prompt_then_steps(qf_context *c, bool ok, const int32_t *t, int np, int n, bool alt, qf_error *e) {
    const int V = qf_model_hparams(qf_context_model(c))->n_vocab;
    float *lg = ok ? malloc((size_t)n * V * sizeof(float)) : NULL;
    ok = lg && qf_decode(c, t, np, 0, lg, 0, e) == QF_OK;
    for (int i = np, b = 1; ok && i < n; i += b, b = alt ? 3 - b : 1) {
        if (i + b > n) b = n - i;
        ok = qf_decode(c, t + i, b, i, lg + (size_t)i * V, 0, e) == QF_OK;
    }
    qf_context_free(c);
    if (!ok) {
        fprintf(stderr, "  %s\n", e->msg);
        free(lg);
        return NULL;
    }
    return lg;
}

/* the logits of a np-token prompt then n - np decode steps in a context made with cp, the
 * environment variable env (if any) set while it is made, and a kv-int8 payload of these layouts
 * bound (klay non-NULL); NULL on any failure (said on stderr) */
static const qf_tap *route_tap; /* route_logits installs it (NULL: none) */

static float *route_logits(qf_model *m, const qf_context_params *cp, const char *env, const int32_t *t, int np, int n,
                           const char *klay, const char *vlay) {
    if (env) setenv(env, "1", 1);
    qf_error e = {0};
    qf_context *c = qf_context_new(m, cp, &e);
    if (env) unsetenv(env);
    if (!c) {
        fprintf(stderr, "  %s\n", e.msg);
        return NULL;
    }
    if (klay && test_bind_int8(c, klay, vlay, &e)) { /* a kv-int8 payload with these row layouts */
        fprintf(stderr, "  %s\n", e.msg);
        qf_context_free(c);
        return NULL;
    }
    if (route_tap) qf_context_set_tap(c, route_tap);
    return prompt_then_steps(c, true, t, np, n, false, &e);
}

static float *rot_logits(qf_model *m, qf_kv_mode mode, bool norotq, bool canon, int threads, const int32_t *t, int np,
                         int n, const char *klay, const char *vlay) {
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = threads, cp.kv_k = cp.kv_v = mode, cp.kv_rot = klay ? QF_KV_ROT_NONE : QF_KV_ROT_HADAMARD;
    cp.device = QF_DEVICE_CPU, cp.canonical = canon;
    return route_logits(m, &cp, norotq ? "QF_NO_ROTQ" : NULL, t, np, n, klay, vlay);
}

/* kv-int8 ec-rot one-token steps score the keys as they are decoded (forward.c att_job.i8kfused:
 * qf_kv_int8_ec_dot16, K rows never stored, each stream split into one run per thread): the same
 * bits as QF_I8_NOFUSE's decode into kbuf and qf_vec_rows_dot, logits of a 13-token prompt then
 * 35 steps (T 14..48: runs of 16 and 32 rows and tails of 1-15), 1, 2 and 3 threads */
TEST(int8_ec_keys_scored_in_gather) {
    qf_model *m = demo();
    if (!m) SKIP("demo model not in ../shared/data");
    const int np = 13, n = 48, V = qf_model_hparams(m)->n_vocab;
    int32_t t[48];
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 7919 + 13) % V);
    for (int th = 1; th <= 3; th++) {
        qf_context_params cp = qf_context_default_params();
        cp.n_ctx = 64, cp.n_threads = th, cp.device = QF_DEVICE_CPU;
        setenv("QF_I8_NOVFUSE", "1", 1); /* V through vbuf on both sides (int8_ec_values_summed_in_gather) */
        float *a = route_logits(m, &cp, NULL, t, np, n, "ec-rot", "ec-rot"),
              *b = route_logits(m, &cp, "QF_I8_NOFUSE", t, np, n, "ec-rot", "ec-rot");
        unsetenv("QF_I8_NOVFUSE");
        CHECK(a && b);
        if (a && b) {
            size_t d = 0;
            for (size_t i = 0; i < (size_t)n * V; i++) d += memcmp(a + i, b + i, sizeof(float)) != 0;
            printf("  %d thread%s: %zu of %zu logits differ from QF_I8_NOFUSE's\n", th, th > 1 ? "s" : "", d, (size_t)n * V);
            CHECK(d == 0);
        }
        free(a), free(b);
    }
    qf_model_free(m);
}

/* kv-int8 ec-rot one-token steps sum V as it is decoded (forward.c att_job.i8vfused:
 * qf_kv_cache_int8_vsum, V rows never stored; chunks of I8_VCHUNK positions summed in order)
 * against QF_I8_NOVFUSE's decode into vbuf and qf_gemm_nn_f32: a different order of the f32 sums,
 * so close, not the same bits. A 13-token prompt then 137 steps (T 14..150: several chunks, runs
 * of 32 and 16 rows and tails of 1-15), 1, 2 and 3 threads: layer 0's attention output (its
 * cached rows the same on both routes) within 1e-5 of each row's largest value (measured
 * ~4e-7); the logits within 5e-3 of the largest (measured ~2e-3: from layer 1 on, a rounding
 * difference can move the step's own K / V row across an int8 step of the cache, which the
 * step then reads, as in kv_cache_read_in_place); the prompt's logits the same bits; and the
 * route's own logits the same bits for 1, 2 and 3 threads (the chunks do not depend on the
 * thread count) */
/* layer 0's attention output of each one-token step (its K and V rows the same on both routes,
 * so the outputs differ only by the order of the sums): rows[step][dim] */
typedef struct {
    float *rows;
    int n, dim;
} att0_cap;

static void att0_act(void *user, int layer, qf_act_site site, int n_tok, int dim, const float *x) {
    att0_cap *a = user;
    if (layer == 0 && site == QF_ACT_ATTN_OUT && n_tok == 1 && a->n < 150 && dim <= a->dim)
        memcpy(a->rows + (size_t)a->n++ * a->dim, x, sizeof(float) * (size_t)dim);
}

TEST(int8_ec_values_summed_in_gather) {
    qf_model *m = demo();
    if (!m) SKIP("demo model not in ../shared/data");
    const int np = 13, n = 150, V = qf_model_hparams(m)->n_vocab;
    int32_t t[150];
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 7919 + 13) % V);
    float *first = NULL;
    for (int th = 1; th <= 3; th++) {
        qf_context_params cp = qf_context_default_params();
        cp.n_ctx = 160, cp.n_threads = th, cp.device = QF_DEVICE_CPU;
        const int Dq = qf_model_hparams(m)->n_head * qf_model_hparams(m)->head_dim;
        att0_cap ca = {calloc((size_t)150 * Dq, sizeof(float)), 0, Dq}, cb = {calloc((size_t)150 * Dq, sizeof(float)), 0, Dq};
        qf_tap ta = {.user = &ca, .on_act = att0_act}, tb = {.user = &cb, .on_act = att0_act};
        route_tap = &ta;
        float *a = ca.rows ? route_logits(m, &cp, NULL, t, np, n, "ec-rot", "ec-rot") : NULL;
        route_tap = &tb;
        float *b = cb.rows ? route_logits(m, &cp, "QF_I8_NOVFUSE", t, np, n, "ec-rot", "ec-rot") : NULL;
        route_tap = NULL;
        CHECK(a && b && ca.n == n - np && cb.n == n - np);
        if (a && b && ca.n == cb.n) { /* layer 0: a reordered f32 sum of at most T terms */
            double worst = 0;
            for (int r = 0; r < ca.n; r++) {
                double mx = 0, dd = 0;
                for (int i = 0; i < Dq; i++)
                    mx = fmax(mx, fabs(cb.rows[(size_t)r * Dq + i])),
                    dd = fmax(dd, fabs((double)ca.rows[(size_t)r * Dq + i] - cb.rows[(size_t)r * Dq + i]));
                worst = fmax(worst, mx > 0 ? dd / mx : dd);
            }
            printf("  %d thread%s: layer 0's attention output, max |V summed as decoded - QF_I8_NOVFUSE| %.2e of the "
                   "row's largest\n", th, th > 1 ? "s" : "", worst);
            CHECK(worst < 1e-5);
        }
        free(ca.rows), free(cb.rows);
        if (a && b) {
            double num = 0, den = 0;
            size_t d = 0;
            for (size_t i = 0; i < (size_t)n * V; i++) {
                num = fmax(num, fabs((double)a[i] - b[i])), den = fmax(den, fabs((double)b[i]));
                d += a[i] != b[i];
            }
            printf("  %d thread%s: max |V summed as decoded - QF_I8_NOVFUSE| %.2e of %.2f (%.1e), %zu of %zu logits differ\n",
                   th, th > 1 ? "s" : "", num, den, num / den, d, (size_t)n * V);
            /* the first step that differs: one layer stack's rounding, before the cache feeds it back */
            int r0 = np;
            while (r0 < n && !memcmp(a + (size_t)r0 * V, b + (size_t)r0 * V, sizeof(float) * (size_t)V)) r0++;
            double first_row = 0;
            for (size_t i = (size_t)r0 * V; r0 < n && i < (size_t)(r0 + 1) * V; i++)
                first_row = fmax(first_row, fabs((double)a[i] - b[i]));
            printf("  %d thread%s: steps before T %d the same bits; the first that differs: max %.2e\n", th,
                   th > 1 ? "s" : "", r0 + 1, first_row);
            CHECK(num / den < 5e-3);
            CHECK(memcmp(a, b, sizeof(float) * (size_t)np * V) == 0); /* the prompt: not the route */
            if (first) {
                const int same = memcmp(first, a, sizeof(float) * (size_t)n * V) == 0;
                printf("  %d threads: the same bits as 1 thread's: %s\n", th, same ? "yes" : "no");
                CHECK(same);
            }
        }
        if (!first && a) first = a, a = NULL;
        free(a), free(b);
    }
    free(first);
    qf_model_free(m);
}

TEST(rot_attention_in_rotated_basis) {
    qf_model *m = demo();
    if (!m) SKIP("demo model not in ../shared/data");
    const int np = 40, n = 48, V = qf_model_hparams(m)->n_vocab;
    int32_t t[48];
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 7919 + 13) % V);
    const qf_kv_mode modes[3] = {QF_KV_F32, QF_KV_Q4_0, QF_KV_Q8_0};
    for (int mi = 0; mi < 3; mi++)
        for (int th = 1; th <= 3; th += 2) {
            float *a = rot_logits(m, modes[mi], false, false, th, t, np, n, NULL, NULL),
                  *b = rot_logits(m, modes[mi], true, false, th, t, np, n, NULL, NULL);
            CHECK(a && b);
            if (a && b) {
                double num = 0, den = 0, nump = 0; /* all rows; the prompt's */
                for (size_t i = 0; i < (size_t)n * V; i++) {
                    num = fmax(num, fabs((double)a[i] - b[i])), den = fmax(den, fabs((double)b[i]));
                    if (i < (size_t)np * V) nump = fmax(nump, fabs((double)a[i] - b[i]));
                }
                printf("  %s, %d thread%s: max |rotated basis - rotate on read| %.2e (prompt %.2e) of %.2f\n",
                       qf_kv_mode_name(modes[mi]), th, th > 1 ? "s" : "", num, nump, den);
                if (mi == 0) CHECK(nump / den < 2e-6);
                CHECK(num / den < 5e-3);
            }
            free(a), free(b);
        }
    /* kv-int8 rows stored rotated: both streams, K only, V only */
    static const char *lay[3][2] = {{"ec-rot", "ec-rot"}, {"ec-rot", "static"}, {"static", "token-rot"}};
    for (int li = 0; li < 3; li++) {
        float *a = rot_logits(m, QF_KV_F16, false, false, 2, t, np, n, lay[li][0], lay[li][1]),
              *b = rot_logits(m, QF_KV_F16, true, false, 2, t, np, n, lay[li][0], lay[li][1]);
        CHECK(a && b);
        if (a && b) {
            double num = 0, den = 0;
            for (size_t i = 0; i < (size_t)n * V; i++)
                num = fmax(num, fabs((double)a[i] - b[i])), den = fmax(den, fabs((double)b[i]));
            printf("  kv-int8 %s / %s: max |rotated basis - rotate on read| %.2e of %.2f\n", lay[li][0], lay[li][1], num, den);
            CHECK(num / den < 5e-3);
        }
        free(a), free(b);
    }
    float *a = rot_logits(m, QF_KV_Q4_0, false, true, 2, t, np, n, NULL, NULL),
          *b = rot_logits(m, QF_KV_Q4_0, true, true, 2, t, np, n, NULL, NULL);
    CHECK(a && b && memcmp(a, b, sizeof(float) * (size_t)n * V) == 0);
    free(a), free(b);
    qf_model_free(m);
}

/* A decode step over a plain f16 / q8_0 / q4_0 cache reads the cache's rows in place
 * (forward.c att_job.kv_direct: qf_vec_rows_dot_kv and qf_gemm_nn_kv, no f32 gather). Against
 * the gather (QF_KV_GATHER, read at context creation), a 40-token prompt then 8 decode steps, 1
 * and 3 threads: the prompt's logits are the same bits (prefill never reads in place); the
 * decode rows agree to 5e-3 of the largest logit (a rounding difference can cross the decode
 * matvec's f16 rounding of the activation or a quantization boundary and grow, as in
 * rot_attention_in_rotated_basis) */
TEST(kv_cache_read_in_place) {
    qf_model *m = demo();
    if (!m) SKIP("demo model not in ../shared/data");
    const int np = 40, n = 48, V = qf_model_hparams(m)->n_vocab;
    int32_t t[48];
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 7919 + 13) % V);
    const qf_kv_mode modes[3] = {QF_KV_F16, QF_KV_Q8_0, QF_KV_Q4_0};
    for (int mi = 0; mi < 3; mi++)
        for (int th = 1; th <= 3; th += 2) {
            qf_context_params cp = qf_context_default_params();
            cp.n_ctx = 64, cp.n_threads = th, cp.kv_k = cp.kv_v = modes[mi], cp.device = QF_DEVICE_CPU;
            float *lg[2] = {route_logits(m, &cp, NULL, t, np, n, NULL, NULL),
                            route_logits(m, &cp, "QF_KV_GATHER", t, np, n, NULL, NULL)};
            CHECK(lg[0] && lg[1]);
            if (lg[0] && lg[1]) {
                CHECK(memcmp(lg[0], lg[1], sizeof(float) * (size_t)np * V) == 0);
                double num = 0, den = 0;
                for (size_t i = (size_t)np * V; i < (size_t)n * V; i++)
                    num = fmax(num, fabs((double)lg[0][i] - lg[1][i])), den = fmax(den, fabs((double)lg[1][i]));
                printf("  %s, %d thread%s: decode rows, max |in place - gathered| %.2e of %.2f\n",
                       qf_kv_mode_name(modes[mi]), th, th > 1 ? "s" : "", num, den);
                CHECK(num / den < 5e-3);
            }
            free(lg[0]), free(lg[1]);
        }
    qf_model_free(m);
}

/* qf_kv_fmt_slots (the parse the coefficient-domain attention runs over every cached code): every
 * half as an f16 coefficient gives qf_f16_to_f32's bits (zeros dropped to index 0, +0); in each
 * layout (byte, 16-bit and packed indices; f16 and q8 coefficients) the slots are the packed
 * indices and the coefficients qf_kv_coef_round keeps, an index past the dictionary dropped, and
 * a slot-major table (ld > 1) gets the same values, as does qf_kv_fmt_slots_rows (a call per table) */
TEST(kv_dict_slots) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        qf_kv_code_fmt f = {.n_atoms = 4, .sparsity = 1, .coef = QF_KV_COEF_F16};
        uint8_t code[3] = {3, (uint8_t)(h & 0xff), (uint8_t)(h >> 8)};
        int32_t i = -1;
        float c = -1, want = qf_f16_to_f32((uint16_t)h);
        qf_kv_fmt_slots(&f, 4, code, &i, &c, 1);
        union { float f; uint32_t u; } a = {.f = c}, b = {.f = want == 0 ? 0.0f : want};
        bad += a.u != b.u || i != (want == 0 ? 0 : 3);
    }
    CHECK_EQ_INT(bad, 0);
    uint64_t r = 5;
    for (int li = 0; li < 6; li++) {
        const int na = li % 3 == 0 ? 200 : li % 3 == 1 ? 1000 : 300, s = 7;
        qf_kv_code_fmt f = {.n_atoms = na, .sparsity = s, .coef = li < 3 ? QF_KV_COEF_F16 : QF_KV_COEF_Q8,
                            .packed = li % 3 == 2};
        uint16_t idx[7];
        float coef[7], want[7], got[2 * 7];
        int32_t gi[2 * 7];
        uint8_t code[64];
        for (int j = 0; j < s; j++)
            idx[j] = (uint16_t)(qf_xorshift64s(&r) % (uint64_t)na), coef[j] = (float)(qf_rand_unit(&r) - 0.5);
        coef[2] = 0;
        memcpy(want, coef, sizeof want);
        qf_kv_coef_round(want, s, f.coef);
        qf_kv_fmt_pack(&f, idx, coef, code);
        qf_kv_fmt_slots(&f, na - 1, code, gi, got, 2); /* a dictionary one atom short: that index dropped */
        for (int j = 0; j < s; j++) {
            bool drop = want[j] == 0 || idx[j] >= na - 1;
            bad += gi[2 * j] != (drop ? 0 : idx[j]) || got[2 * j] != (drop ? 0.0f : want[j]);
        }
        /* qf_kv_fmt_slots_rows: 5 codes 40 bytes apart, the same slots as one call each */
        uint8_t codes[5 * 40];
        int32_t ri[7 * 5], pi[7 * 5];
        float rc[7 * 5], pc[7 * 5];
        for (int k = 0; k < 5; k++) {
            for (int j = 0; j < s; j++)
                idx[j] = (uint16_t)(qf_xorshift64s(&r) % (uint64_t)na), coef[j] = (float)(qf_rand_unit(&r) - 0.5);
            coef[k] = 0;
            qf_kv_fmt_pack(&f, idx, coef, codes + 40 * k);
            qf_kv_fmt_slots(&f, na - 1, codes + 40 * k, pi + k, pc + k, 5);
        }
        qf_kv_fmt_slots_rows(&f, na - 1, codes, 40, 5, ri, rc, 5);
        bad += memcmp(ri, pi, sizeof ri) != 0 || memcmp(rc, pc, sizeof rc) != 0;
    }
    CHECK_EQ_INT(bad, 0);
}

/* A decode step over a kv-dict stream attends it in the coefficient domain (forward.c
 * att_job.kdict / vdict: each query's dot products with the atoms, then s lookups a key; each
 * atom's total weight, then one weighted sum of the atoms) instead of decoding every cached row.
 * Against the expand-then-attend route (QF_KV_DICT_EXPAND=1; =0 takes the coefficient domain
 * whatever the cost estimate says), read at context creation, on a 40-token prompt then decode
 * batches of 1 and 2 tokens to 48, with dictionaries of random unit atoms: both streams dict
 * (K after RoPE: both tricks), 2 and 1 threads; v2 codes (packed indices, q8 coefficients, more
 * than 256 atoms) with K stored before RoPE (V only: a pre-RoPE key is rotated per position after
 * decoding); K dict + V f16 and K q8_0 + V dict; both dict with exact sinks and a recent window.
 * The prompt's logits are the same bits (prefill never takes the route); the decode rows agree to
 * 1e-3 of the largest logit (a different summation order, then the decode matvec's f16 rounding
 * of the activation; measured: printed). */
typedef struct {
    qf_kv_mode mk, mv;
    int n_atoms, sparsity, threads, n_sink, n_window;
    qf_kv_coef coef;
    bool packed, prerope;
} dict_case;

/* the logits of t[0..np) as a prompt, then decode batches of 1 and 2 tokens up to n, in a context
 * whose cache is rebuilt as dc says (dictionaries of random unit atoms from atoms), with
 * QF_KV_DICT_EXPAND=expand while the context is made; NULL on any failure (said on stderr) */
static float *dict_logits(qf_model *m, const dict_case *dc, const float *const *atoms, const char *expand,
                          const int32_t *t, int np, int n) {
    const qf_hparams *hp = qf_model_hparams(m);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = dc->threads, cp.device = QF_DEVICE_CPU;
    setenv("QF_KV_DICT_EXPAND", expand, 1);
    qf_error e = {0};
    qf_context *c = qf_context_new(m, &cp, &e);
    unsetenv("QF_KV_DICT_EXPAND");
    if (!c) {
        fprintf(stderr, "  %s\n", e.msg);
        return NULL;
    }
    qf_kv_stream_spec spec[2];
    for (int s = 0; s < 2; s++)
        spec[s] = (qf_kv_stream_spec){.mode = s ? dc->mv : dc->mk, .n_atoms = dc->n_atoms, .sparsity = dc->sparsity,
                                      .coef = dc->coef, .atoms = atoms, .packed = dc->packed,
                                      .prerope = s == 0 && dc->prerope};
    qf_kv_cache fresh;
    bool ok = qf_kv_cache_init_spec(&fresh, hp, cp.n_ctx, spec, &e) == QF_OK;
    if (ok && (dc->n_sink || dc->n_window) && qf_kv_cache_set_exact(&fresh, dc->n_sink, dc->n_window, &e)) {
        qf_kv_cache_free(&fresh);
        ok = false;
    }
    if (ok) {
        qf_kv_cache_free(&c->kv);
        c->kv = fresh;
        c->params.kv_k = spec[0].mode, c->params.kv_v = spec[1].mode;
    }
    return prompt_then_steps(c, ok, t, np, n, true, &e); /* batches of 1, 2, 1, 2, ... */
}

TEST(kv_dict_coefficient_domain) {
    qf_model *m = demo();
    if (!m) SKIP("demo model not in ../shared/data");
    const qf_hparams *hp = qf_model_hparams(m);
    const int np = 40, n = 48, V = hp->n_vocab, hd = hp->head_dim, A = 300;
    int32_t t[48];
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 7919 + 13) % V);
    /* per layer: A random unit-norm atoms (qf_kv_dict_init normalizes them) */
    float *store = malloc(sizeof(float) * (size_t)hp->n_layer * A * hd);
    const float **atoms = calloc((size_t)hp->n_layer, sizeof *atoms);
    CHECK(store && atoms);
    if (!store || !atoms) {
        free(store), free(atoms), qf_model_free(m);
        return;
    }
    uint64_t r = 77;
    for (size_t i = 0; i < (size_t)hp->n_layer * A * hd; i++) store[i] = (float)(qf_rand_unit(&r) - 0.5);
    for (int l = 0; l < hp->n_layer; l++) atoms[l] = store + (size_t)l * A * hd;
    const dict_case cases[] = {
        {QF_KV_DICT, QF_KV_DICT, 96, 8, 2, 0, 0, QF_KV_COEF_F16, false, false},
        {QF_KV_DICT, QF_KV_DICT, 96, 8, 1, 0, 0, QF_KV_COEF_F16, false, false},
        {QF_KV_DICT, QF_KV_DICT, 300, 6, 2, 0, 0, QF_KV_COEF_Q8, true, true},
        {QF_KV_DICT, QF_KV_F16, 128, 8, 2, 0, 0, QF_KV_COEF_F16, false, false},
        {QF_KV_Q8_0, QF_KV_DICT, 128, 8, 2, 0, 0, QF_KV_COEF_Q8, true, false},
        {QF_KV_DICT, QF_KV_DICT, 96, 8, 2, 3, 5, QF_KV_COEF_F16, false, false},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const dict_case *dc = &cases[ci];
        float *a = dict_logits(m, dc, atoms, "0", t, np, n), *b = dict_logits(m, dc, atoms, "1", t, np, n);
        CHECK(a && b);
        if (a && b) {
            CHECK(memcmp(a, b, sizeof(float) * (size_t)np * V) == 0);
            double num = 0, den = 0;
            for (size_t i = (size_t)np * V; i < (size_t)n * V; i++)
                num = fmax(num, fabs((double)a[i] - b[i])), den = fmax(den, fabs((double)b[i]));
            printf("  K %s, V %s (%d x %d %s%s%s), sinks %d, window %d, %d thread%s: decode rows, max |coefficient "
                   "domain - expanded| %.2e of %.2f (%.1e)\n",
                   qf_kv_mode_name(dc->mk), qf_kv_mode_name(dc->mv), dc->n_atoms, dc->sparsity,
                   qf_kv_coef_name(dc->coef), dc->packed ? ", packed" : "", dc->prerope ? ", K pre-RoPE" : "",
                   dc->n_sink, dc->n_window, dc->threads, dc->threads > 1 ? "s" : "", num, den, num / den);
            CHECK(num / den < 1e-3);
            CHECK(num > 0); /* the routes differ in rounding: the coefficient domain ran */
        }
        free(a), free(b);
    }
    free(store), free(atoms);
    qf_model_free(m);
}

int main(void) {
    RUN(rot_names);
    RUN(rot_round_trip);
    RUN(rot_refusals_in_the_cache);
    RUN(rot_q4_0_beats_plain_q4_0);
    RUN(rot_attention_in_rotated_basis);
    RUN(kv_dict_slots);
    RUN(kv_dict_coefficient_domain);
    RUN(kv_cache_read_in_place);
    RUN(rot_refusals_in_the_context);
    RUN(delta_ppl_paired_se);
    RUN(kld_rows_thread_invariant);
    RUN(int8_token_codec);
    RUN(int8_ec_codec);
    RUN(int8_ec_decoder_matches_reference);
    RUN(int8_ec_decoder16_matches_reference);
    RUN(int8_ec_decoder16_seg_matches_reference);
    RUN(int8_ec_dot16_matches_reference);
    RUN(int8_ec_keys_scored_in_gather);
    RUN(int8_ec_wsum16_matches_reference);
    RUN(int8_ec_values_summed_in_gather);
    RUN(int8_layouts_in_the_cache);
    RUN(int8_layout_payload);
    return test_summary();
}
