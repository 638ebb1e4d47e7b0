/* test_kv_rq_klt.c: kv-rq payload format 3 (transform coding with per-coordinate widths):
 * variable-width packing bit by bit, the row codec against a scalar oracle, the learner on
 * synthetic low-rank data (widths sum to the budget, beats the Hadamard rows of the same fit),
 * and the loader's checks on a format-3 payload (valid binds and runs; each tampered field is
 * refused with a clear error). */
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/kv_rq.h"
#include "engine/kv_rq_klt.h"
#include "qforge/artifact_bind.h"
#include "qforge/kv_rq.h"
#include "qforge/model.h"
#include "test.h"
#include "util/util.h"

static float gauss(uint64_t *s) {
    double u1 = ((double)(qf_xorshift64s(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(qf_xorshift64s(s) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

TEST(klt_pack_unpack_bit_by_bit) {
    uint8_t width[64], codes[64], back[64], packed[64];
    uint64_t s = 5;
    int total = 0;
    for (int i = 0; i < 64; i++) width[i] = (uint8_t)(qf_xorshift64s(&s) % 7), total += width[i];
    for (int i = 0; i < 64; i++) codes[i] = width[i] ? (uint8_t)(qf_xorshift64s(&s) % (1u << width[i])) : 0;
    qf_kv_rq_klt_pack(codes, width, 64, packed);
    int sb = 0;
    for (int i = 0; i < 64; i++) /* oracle: coordinate i occupies the next width[i] stream bits */
        for (int j = 0; j < width[i]; j++, sb++) CHECK(((packed[sb / 8] >> (sb % 8)) & 1) == ((codes[i] >> j) & 1));
    CHECK_EQ_INT(sb, total);
    qf_kv_rq_klt_unpack(packed, width, 64, back);
    CHECK(memcmp(codes, back, 64) == 0);
}

/* the oracle decoder: bit-by-bit unpacking, double-precision matrix product */
static void oracle_decode(const qf_kv_rq_klt *c, const uint8_t *row, float *out) {
    int D = c->head_dim, sb = 0;
    double s = row[0] ? pow(2.0, (row[0] - 128) / 8.0) : 0.0, y[256];
    for (int i = 0; i < D; i++) {
        int code = 0;
        for (int j = 0; j < c->width[i]; j++, sb++) code |= ((row[1 + sb / 8] >> (sb % 8)) & 1) << j;
        y[i] = c->width[i] ? s * c->sigma[i] * c->levels[(size_t)i * QF_KV_RQ_MAX_LEVELS + code] : 0;
    }
    for (int i = 0; i < D; i++) {
        double a = c->mean[i];
        for (int j = 0; j < D; j++) a += (double)c->dec[(size_t)i * D + j] * y[j];
        out[i] = (float)a;
    }
}

/* synthetic low-rank-ish head vectors: a few strong directions plus small isotropic noise */
static float *lowrank(int n, int D, uint64_t *s) {
    float *x = malloc(sizeof(float) * (size_t)n * D), *basis = malloc(sizeof(float) * 8 * (size_t)D);
    for (int k = 0; k < 8 * D; k++) basis[k] = gauss(s) / sqrtf((float)D);
    for (int r = 0; r < n; r++) {
        double cf[8];
        for (int k = 0; k < 8; k++) cf[k] = (8.0 / (k + 1)) * gauss(s);
        for (int i = 0; i < D; i++) {
            double a = 0.5 + 0.05 * gauss(s);
            for (int k = 0; k < 8; k++) a += cf[k] * basis[k * D + i];
            x[(size_t)r * D + i] = (float)a;
        }
    }
    free(basis);
    return x;
}

TEST(klt_learner_widths_oracle_and_gain) {
    enum { D = 64, N = 3000 };
    uint64_t s = 21;
    float *k = lowrank(N, D, &s), *v = lowrank(N, D, &s);
    const float *kk[1] = {k}, *vv[1] = {v};
    int64_t nk[1] = {N}, nv[1] = {N};
    qf_kv_capture_view cv = {.n_layer = 1, .n_kv_head = 1, .head_dim = D, .k = kk, .v = vv, .n_k = nk, .n_v = nv};
    qf_kv_rq_learn_params lp;
    qf_kv_rq_learn_params_default(&lp);
    lp.lloyd_iters = 20;
    qf_kv_rq_fit f;
    qf_error e = {0};
    CHECK_EQ_INT(qf_kv_rq_learn(&cv, &lp, &f, &e), QF_OK);
    CHECK_EQ_INT(qf_kv_rq_learn_klt(&cv, NULL, NULL, &lp, &f, &e), QF_OK);
    CHECK(f.klt != NULL);
    if (!f.klt) goto out;
    for (int r8 = 0; r8 < QF_KV_RQ_KLT_N_RATES; r8++) { /* every head's widths spend exactly r8 * D / 8 bits */
        int sum = 0;
        for (int i = 0; i < D; i++) sum += f.klt->width[0][(size_t)r8 * D + i];
        CHECK_EQ_INT(sum, r8 * D / 8);
        if (r8) CHECK(f.klt->rel8[0][r8] <= f.klt->rel8[0][r8 - 1]);
    }
    /* the fractional allocation: within the budget, more bits to the sensitive unit */
    {
        double sk = 1.0, sv = 0.01;
        const double *sens[2] = {&sk, &sv};
        int bk, bv, *bits[2] = {&bk, &bv};
        qf_kv_rq_klt_allocate(&f, sens, 1.75, 1, bits);
        int ek = qf_kv_rq_klt_eighths(bk), ev = qf_kv_rq_klt_eighths(bv);
        printf("  allocation within 1.75 bits: K %d/8 V %d/8\n", ek, ev);
        CHECK(ek >= 8 && ev >= 8 && ek + ev <= 28 && ek > ev);
        CHECK_EQ_INT((int)qf_kv_rq_any_row_bytes(D, bk), 1 + ek);
    }
    printf("  relative error klt / hadamard at 2 bits: K %.4f / %.4f\n", f.rel_mse[0][1], f.klt->had_rel_mse[0][1]);
    CHECK(f.rel_mse[0][1] < 0.5 * f.klt->had_rel_mse[0][1]); /* low-rank data: a large transform-coding gain */
    /* the codec against the oracle, at the 2-bit allocation */
    float lv[D * QF_KV_RQ_MAX_LEVELS];
    const uint8_t *wd = f.klt->width[0] + 16 * D; /* 2 bits per element */
    for (int i = 0; i < D; i++)
        memcpy(lv + (size_t)i * QF_KV_RQ_MAX_LEVELS,
               f.klt->levels[0] + ((size_t)i * QF_KV_RQ_N_WIDTHS + (wd[i] ? wd[i] - 1 : 0)) * QF_KV_RQ_MAX_LEVELS,
               sizeof(float) * QF_KV_RQ_MAX_LEVELS);
    qf_kv_rq_klt c = {.head_dim = D, .mean = f.mean[0], .enc = f.klt->enc[0], .dec = f.klt->dec[0],
                      .sigma = f.klt->sigma[0], .levels = lv, .width = wd};
    CHECK(qf_kv_rq_klt_check(&c, 2 * D) == NULL);
    CHECK(qf_kv_rq_klt_check(&c, 3 * D) != NULL);
    uint8_t row[1 + D];
    float sc[2 * D], a[D], o[D];
    double worst = 0;
    for (int r = 0; r < 200; r++) {
        qf_kv_rq_klt_encode(&c, k + (size_t)r * D, sc, row);
        qf_kv_rq_klt_decode(&c, row, a);
        oracle_decode(&c, row, o);
        for (int i = 0; i < D; i++) worst = fmax(worst, fabs((double)a[i] - o[i]));
    }
    CHECK(worst < 1e-4);
    /* the generic codec dispatches to format 3 */
    qf_kv_rq_codec g = {.head_dim = D, .bits = 2, .mean = f.mean[0], .klt = c};
    qf_kv_rq_encode(&g, k, sc, row);
    qf_kv_rq_decode(&g, row, o);
    qf_kv_rq_klt_decode(&c, row, a);
    CHECK(memcmp(a, o, sizeof a) == 0);
    /* non-finite input: a zero row that decodes to the mean */
    float bad[D];
    for (int i = 0; i < D; i++) bad[i] = i == 7 ? NAN : 1.0f;
    qf_kv_rq_klt_encode(&c, bad, sc, row);
    CHECK(row[0] == 0);
    qf_kv_rq_klt_decode(&c, row, a);
    for (int i = 0; i < D; i++) CHECK(a[i] == f.mean[0][i]);
out:
    qf_kv_rq_fit_free(&f);
    free(k), free(v);
}

/* a format-3 payload for the demo model (6 layers, 2 kv heads, head_dim 64): identity
 * transform, 2 bits on every coordinate; `tamper` breaks one field */
enum { PL = 6, PH = 2, PD = 64 };
static void klt_payload(qf_payload *pl, int fmt, const char *rot, const char *tamper) {
    static float lv[PL * PH * 64], mean[PL * PH * PD], cs[PL * PH * PD], eye[PL * PH * PD * PD], sig[PL * PH * PD],
        klv[PL * PH * PD * 64];
    static uint8_t wd[PL * PH * PD];
    for (int i = 0; i < PL * PH * 64; i++) lv[i] = (float)(i % 64) - 31.5f;
    for (int i = 0; i < PL * PH * PD; i++) mean[i] = 0.01f * (float)(i % 7), cs[i] = 1.0f, sig[i] = 0.5f, wd[i] = 2;
    memset(eye, 0, sizeof eye);
    for (int lh = 0; lh < PL * PH; lh++)
        for (int i = 0; i < PD; i++) eye[((size_t)lh * PD + i) * PD + i] = 1;
    for (int i = 0; i < PL * PH * PD * 64; i++) klv[i] = (float)(i % 64) * 0.5f - 0.75f;
    if (tamper && !strcmp(tamper, "width")) wd[5] = 3;            /* row bits no longer 2 * 64 */
    if (tamper && !strcmp(tamper, "sigma")) sig[9] = 0;
    if (tamper && !strcmp(tamper, "matrix")) eye[77] = NAN;
    if (tamper && !strcmp(tamper, "levels")) klv[64 * 3 + 1] = -5; /* not ascending */
    uint8_t b[PL];
    memset(b, 2, sizeof b);
    int64_t sh1[1] = {PL}, shl[3] = {PL, PH, 64}, shv[3] = {PL, PH, PD}, shm[4] = {PL, PH, PD, PD},
            shk[4] = {PL, PH, PD, 64}, shbad[4] = {PL, PH, PD, 32};
    qf_error e = {0};
    memset(pl, 0, sizeof *pl);
    qf_payload_add_int(pl, "format", fmt, &e);
    qf_payload_add_string(pl, "rotation", rot, &e);
    qf_payload_add_int(pl, "n_sink", 1, &e);
    qf_payload_add_int(pl, "n_window", 4, &e);
    qf_payload_add_int(pl, "k_prerope", 1, &e);
    for (int s = 0; s < 2; s++) {
        const char *p = s ? "v" : "k";
        char n[32];
#define NAME(x) (snprintf(n, sizeof n, "%s_%s", p, x), n)
        qf_payload_add_u8(pl, NAME("bits"), b, 1, sh1, &e);
        qf_payload_add_f32(pl, NAME("levels"), lv, 3, shl, &e);
        qf_payload_add_f32(pl, NAME("mean"), mean, 3, shv, &e);
        qf_payload_add_f32(pl, NAME("cs"), cs, 3, shv, &e);
        qf_payload_add_f32(pl, NAME("klt_enc"), eye, 4, shm, &e);
        if (!(tamper && !strcmp(tamper, "missing") && s == 1)) qf_payload_add_f32(pl, NAME("klt_dec"), eye, 4, shm, &e);
        qf_payload_add_f32(pl, NAME("klt_sigma"), sig, 3, shv, &e);
        qf_payload_add_u8(pl, NAME("klt_width"), wd, 3, shv, &e);
        qf_payload_add_f32(pl, NAME("klt_levels"), klv, 4, tamper && !strcmp(tamper, "shape") ? shbad : shk, &e);
#undef NAME
    }
}

TEST(klt_payload_binds_and_refuses_tampering) {
    const char *path = test_data("models/qforge-demo-11m-f16.gguf");
    if (!path) SKIP("demo model not in ../shared/data");
    qf_error e = {0};
    qf_model *m = qf_model_load(path, &e);
    CHECK(m != NULL);
    if (!m) return;
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = 1;
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK(c != NULL);
    if (!c) {
        qf_model_free(m);
        return;
    }
    qf_payload pl;
    klt_payload(&pl, 3, "klt", NULL);
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_OK);
    CHECK(c->kv.rq[0] && c->kv.rq[0]->klt_enc && c->kv.rq[0]->row_bytes[0] == 17);
    CHECK_NEAR(qf_artifact_bits_per_element(QF_ARTIFACT_KV_RQ, &pl, qf_model_hparams(m), 512), 2.125 + 16.0 * 5 / 512,
               1e-9);
    int32_t tok[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    CHECK_EQ_INT(qf_decode(c, tok, 12, 0, NULL, 12, &e), QF_OK);
    qf_payload_free(&pl);
    static const char *const bad[] = {"width", "sigma", "matrix", "levels", "missing", "shape"};
    static const char *const why[] = {"bits", "sigma", "matrix", "levels", "v_klt_dec", "klt_levels"};
    for (int t = 0; t < 6; t++) {
        klt_payload(&pl, 3, "klt", bad[t]);
        e = (qf_error){0};
        CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
        printf("  tampered %s: %s\n", bad[t], e.msg);
        CHECK(strstr(e.msg, why[t]) != NULL);
        qf_payload_free(&pl);
    }
    klt_payload(&pl, 3, "hadamard", NULL); /* format 3 says klt */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
    CHECK(strstr(e.msg, "rotation") != NULL);
    qf_payload_free(&pl);
    klt_payload(&pl, 2, "klt", NULL); /* format 2 is Hadamard */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
    qf_payload_free(&pl);
    klt_payload(&pl, 4, "klt", NULL); /* a newer format */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_VERSION);
    CHECK(strstr(e.msg, "formats 1, 2 and 3") != NULL);
    qf_payload_free(&pl);
    /* still usable after the refusals: the valid payload binds again */
    klt_payload(&pl, 3, "klt", NULL);
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_OK);
    qf_payload_free(&pl);
    qf_context_free(c);
    qf_model_free(m);
}

/* The learners on a thread pool: formats 2 and 3 (and the V predictor's ridge fit) give the same
 * bits for 1 and 3 threads (every unit computed by one thread in the serial order, the sums
 * added in the serial order). 2 layers x 2 kv heads, so the units interleave over the threads. */
static bool same(const void *a, const void *b, size_t n) { return (!a && !b) || (a && b && memcmp(a, b, n) == 0); }

/* gpu = true where no GPU answers: a clear QF_ERR_DEVICE from the learner and from the KLT fit,
 * nothing half-built left behind (the sanitizer pass checks the frees). With a GPU, test_cuda
 * op_rq_learn covers the device path. */
TEST(learn_gpu_without_one_is_a_clear_error) {
    if (qf_cuda_available()) SKIP("a CUDA GPU answers here: test_cuda op_rq_learn runs the device path");
    enum { D = 32, H = 2, N = 600 };
    uint64_t s = 5;
    float *k = lowrank(N * H, D, &s), *v = lowrank(N * H, D, &s);
    for (size_t i = 0; i < (size_t)N * H * D; i++) v[i] += 2.0f * k[i]; /* the predictor is used */
    const float *kk[1] = {k}, *vv[1] = {v};
    int64_t nk[1] = {N * H}, nv[1] = {N * H};
    qf_kv_capture_view cv = {.n_layer = 1, .n_kv_head = H, .head_dim = D, .k = kk, .v = vv, .n_k = nk, .n_v = nv};
    qf_kv_rq_learn_params lp;
    qf_kv_rq_learn_params_default(&lp);
    lp.lloyd_iters = 4, lp.v_pred = true, lp.gpu = true;
    qf_kv_rq_fit f;
    qf_error e = {0};
    CHECK_EQ_INT(qf_kv_rq_learn(&cv, &lp, &f, &e), QF_ERR_DEVICE);
    printf("  learn: %s\n", e.msg);
    CHECK(strstr(e.msg, "on the GPU") != NULL && strstr(e.msg, "CUDA") != NULL);
    CHECK(f.v_pred == NULL && f.mean[0] == NULL); /* the failed fit holds nothing */
    lp.gpu = false;
    CHECK_EQ_INT(qf_kv_rq_learn(&cv, &lp, &f, &e), QF_OK);
    lp.gpu = true;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(qf_kv_rq_learn_klt(&cv, NULL, NULL, &lp, &f, &e), QF_ERR_DEVICE);
    printf("  klt: %s\n", e.msg);
    CHECK(strstr(e.msg, "on the GPU") != NULL);
    CHECK(f.klt == NULL); /* the fit it was given is left as it was */
    qf_kv_rq_fit_free(&f);
    free(k), free(v);
}

/* The V predictor's ridge fit takes its output columns four at a time (the triangular solves, the
 * residual's sums): column k of a 7-output fit must be the bits of a fit of column k alone, for
 * the grouped columns and the three left over. */
TEST(linear_fit_columns_independent) {
    enum { N = 300, DX = 24, DY = 7 };
    uint64_t s = 9;
    float *x = lowrank(N, DX, &s), *y = malloc(sizeof(float) * N * DY), *y1 = malloc(sizeof(float) * N);
    for (int r = 0; r < N; r++)
        for (int k = 0; k < DY; k++) y[r * DY + k] = 0.7f * x[r * DX + (3 * k) % DX] - 0.2f * x[r * DX + k] + 0.1f * gauss(&s);
    float P[DY * DX], P1[DX];
    double ratio = qf_kv_rq_linear_fit(x, y, N, DX, DY, 0.2, P);
    CHECK(ratio > 0 && ratio < 0.5);
    for (int k = 0; k < DY; k++) {
        for (int r = 0; r < N; r++) y1[r] = y[r * DY + k];
        CHECK(qf_kv_rq_linear_fit(x, y1, N, DX, 1, 0.2, P1) >= 0);
        CHECK(memcmp(P1, P + k * DX, sizeof P1) == 0);
    }
    free(x), free(y), free(y1);
}

TEST(learn_threads_bit_identical) {
    enum { D = 64, H = 2, L = 2, N = 1200 };
    uint64_t s = 77;
    float *k[L], *v[L];
    for (int l = 0; l < L; l++) { /* V = 2 K + independent data: the predictor is used */
        k[l] = lowrank(N * H, D, &s), v[l] = lowrank(N * H, D, &s);
        for (size_t i = 0; i < (size_t)N * H * D; i++) v[l][i] += 2.0f * k[l][i];
    }
    const float *kk[L] = {k[0], k[1]}, *vv[L] = {v[0], v[1]};
    int64_t nk[L] = {N * H, N * H}, nv[L] = {N * H, N * H};
    qf_kv_capture_view cv = {.n_layer = L, .n_kv_head = H, .head_dim = D, .k = kk, .v = vv, .n_k = nk, .n_v = nv};
    qf_kv_rq_fit f[2];
    qf_error e = {0};
    for (int t = 0; t < 2; t++) {
        qf_kv_rq_learn_params lp;
        qf_kv_rq_learn_params_default(&lp);
        lp.lloyd_iters = 8, lp.v_pred = true, lp.n_threads = t ? 3 : 1;
        CHECK_EQ_INT(qf_kv_rq_learn(&cv, &lp, &f[t], &e), QF_OK);
        lp.max_rows = 1000;
        CHECK_EQ_INT(qf_kv_rq_learn_klt(&cv, NULL, NULL, &lp, &f[t], &e), QF_OK);
    }
    size_t nlhd = (size_t)L * H * D, HD = (size_t)H * D;
    CHECK(f[0].v_pred && f[1].v_pred && f[0].klt && f[1].klt);
    if (!f[0].klt || !f[1].klt || !f[0].v_pred || !f[1].v_pred) goto out;
    CHECK(same(f[0].v_pred, f[1].v_pred, sizeof(float) * L * HD * HD));
    CHECK(same(f[0].v_pred_ratio, f[1].v_pred_ratio, sizeof(double) * L));
    CHECK(f[0].v_pred_ratio[0] < 0.9);
    for (int st = 0; st < 2; st++) {
        CHECK(same(f[0].mean[st], f[1].mean[st], sizeof(float) * nlhd));
        CHECK(same(f[0].cs[st], f[1].cs[st], sizeof(float) * nlhd));
        CHECK(same(f[0].rel_mse[st], f[1].rel_mse[st], sizeof(double) * L * QF_KV_RQ_N_WIDTHS));
        for (int w = 0; w < QF_KV_RQ_N_WIDTHS; w++)
            CHECK(same(f[0].levels[st][w], f[1].levels[st][w], sizeof(float) * (size_t)L * H * QF_KV_RQ_MAX_LEVELS));
        const qf_kv_rq_klt_fit *a = f[0].klt, *b = f[1].klt;
        CHECK(same(a->enc[st], b->enc[st], sizeof(float) * nlhd * D));
        CHECK(same(a->dec[st], b->dec[st], sizeof(float) * nlhd * D));
        CHECK(same(a->sigma[st], b->sigma[st], sizeof(float) * nlhd));
        CHECK(same(a->levels[st], b->levels[st], sizeof(float) * nlhd * QF_KV_RQ_N_WIDTHS * QF_KV_RQ_MAX_LEVELS));
        CHECK(same(a->width[st], b->width[st], (size_t)QF_KV_RQ_KLT_N_RATES * nlhd));
        CHECK(same(a->rel8[st], b->rel8[st], sizeof(double) * L * QF_KV_RQ_KLT_N_RATES));
        CHECK(same(a->eig[st], b->eig[st], sizeof(double) * nlhd));
        CHECK(same(a->had_rel_mse[st], b->had_rel_mse[st], sizeof(double) * L * QF_KV_RQ_N_WIDTHS));
    }
    printf("  V prediction residual ratio, layer 0: %.4f; K rel. error at 2 bits: %.4f\n", f[0].v_pred_ratio[0],
           f[0].rel_mse[0][1]);
out:
    qf_kv_rq_fit_free(&f[0]), qf_kv_rq_fit_free(&f[1]);
    for (int l = 0; l < L; l++) free(k[l]), free(v[l]);
}

/* qf_kv_rq_payload_update (the sensitivity and window loops' payloads): a payload built for one
 * allocation and rewritten for another is entry for entry, byte for byte, the payload built for
 * the second; a payload of another fit is refused and left as it was. Format 3 and format 2. */

TEST(payload_update_matches_a_fresh_build) {
    enum { D = 32, H = 2, L = 2, N = 600 };
    uint64_t s = 11;
    float *k[L], *v[L];
    for (int l = 0; l < L; l++) {
        k[l] = lowrank(N * H, D, &s), v[l] = lowrank(N * H, D, &s);
        for (size_t i = 0; i < (size_t)N * H * D; i++) v[l][i] += 2.0f * k[l][i];
    }
    const float *kk[L] = {k[0], k[1]}, *vv[L] = {v[0], v[1]};
    int64_t nk[L] = {N * H, N * H}, nv[L] = {N * H, N * H};
    qf_kv_capture_view cv = {.n_layer = L, .n_kv_head = H, .head_dim = D, .k = kk, .v = vv, .n_k = nk, .n_v = nv};
    qf_kv_rq_learn_params lp;
    qf_kv_rq_learn_params_default(&lp);
    lp.lloyd_iters = 4, lp.v_pred = true;
    qf_kv_rq_fit f;
    qf_error e = {0};
    CHECK_EQ_INT(qf_kv_rq_learn(&cv, &lp, &f, &e), QF_OK);
    f.k_prerope = true;
    for (int fmt = 3; fmt >= 2; fmt--) {
        if (fmt == 3) {
            CHECK_EQ_INT(qf_kv_rq_learn_klt(&cv, NULL, NULL, &lp, &f, &e), QF_OK);
            if (!f.klt) break;
            f.klt->eighths = true;
        } else qf_kv_rq_klt_fit_free(f.klt), f.klt = NULL;
        int ka[L] = {QF_KV_RQ_SENS_BITS, QF_KV_RQ_BITS_F16}, va[L] = {QF_KV_RQ_BITS_F16, QF_KV_RQ_BITS_F16};
        int kb[L], vb[L];
        int *a[2] = {ka, va}, *b[2] = {kb, vb};
        double ones[L] = {1, 1};
        const double *sens[2] = {ones, ones};
        qf_kv_rq_allocate_min(&f, sens, 2.5, 1, b); /* a real allocation: fractional rates for format 3 */
        qf_payload p1 = {0}, p2 = {0}, p3 = {0};
        CHECK_EQ_INT(qf_kv_rq_payload(&f, (const int *const *)a, 1, 3, &p1, &e), QF_OK);
        CHECK_EQ_INT(qf_kv_rq_payload(&f, (const int *const *)b, 4, 0, &p2, &e), QF_OK);
        CHECK(!qf_payload_equal(&p1, &p2));
        CHECK_EQ_INT(qf_kv_rq_payload_update(&f, (const int *const *)b, 4, 0, &p1, &e), QF_OK);
        CHECK(qf_payload_equal(&p1, &p2));
        CHECK_EQ_INT(qf_kv_rq_payload_update(&f, (const int *const *)a, 1, 3, &p1, &e), QF_OK); /* and back */
        CHECK_EQ_INT(qf_kv_rq_payload(&f, (const int *const *)a, 1, 3, &p3, &e), QF_OK);
        CHECK(qf_payload_equal(&p1, &p3));
        /* another fit's payload: a format-2 payload for a format-3 fit and the other way round,
         * or one without the allocation's entries */
        qf_payload q = {0};
        CHECK_EQ_INT(qf_payload_add_int(&q, "n_sink", 7, &e), QF_OK);
        CHECK_EQ_INT(qf_payload_add_int(&q, "n_window", 9, &e), QF_OK);
        CHECK_EQ_INT(qf_kv_rq_payload_update(&f, (const int *const *)b, 4, 0, &q, &e), QF_ERR_ARG);
        printf("  format %d, refused: %s\n", fmt, e.msg);
        int64_t v7 = 0, v9 = 0;
        CHECK(qf_payload_get_int(&q, "n_sink", &v7) && v7 == 7 && qf_payload_get_int(&q, "n_window", &v9) && v9 == 9);
        qf_payload_free(&q), qf_payload_free(&p1), qf_payload_free(&p2), qf_payload_free(&p3);
    }
    qf_kv_rq_fit_free(&f);
    for (int l = 0; l < L; l++) free(k[l]), free(v[l]);
}

/* qf_context_bind_payload_in_place (the certifier's bind): the cache reads the V predictor and
 * format 3's matrices from the payload instead of copying them, and runs the same bits (the
 * logits of 16 tokens equal those of a copied bind); it still checks them (a non-finite
 * predictor coefficient or transform entry is refused, the context stays unbound and usable).
 * A synthetic fit at the embedded demo model's shape (6 layers x 2 kv heads x 64). */
TEST(bind_in_place_same_logits_and_checks) {
    const char *path = "assets/models/qforge-demo-11m-f16.gguf";
    qf_error e = {0};
    qf_model *m = qf_model_load(path, &e);
    CHECK(m != NULL);
    if (!m) return;
    const qf_hparams *hp = qf_model_hparams(m);
    enum { N = 300 };
    int L = hp->n_layer, H = hp->n_head_kv, D = hp->head_dim;
    uint64_t s = 5;
    float **k = calloc((size_t)L, sizeof *k), **v = calloc((size_t)L, sizeof *v);
    int64_t *nk = calloc((size_t)L, sizeof *nk);
    for (int l = 0; l < L; l++) {
        k[l] = lowrank(N * H, D, &s), v[l] = lowrank(N * H, D, &s), nk[l] = N * H;
        for (size_t i = 0; i < (size_t)N * H * D; i++) v[l][i] += 0.5f * k[l][i];
    }
    qf_kv_capture_view cv = {.n_layer = L, .n_kv_head = H, .head_dim = D, .k = (const float *const *)k,
                             .v = (const float *const *)v, .n_k = nk, .n_v = nk};
    qf_kv_rq_learn_params lp;
    qf_kv_rq_learn_params_default(&lp);
    lp.lloyd_iters = 4, lp.v_pred = true;
    qf_kv_rq_fit f;
    memset(&f, 0, sizeof f);
    CHECK_EQ_INT(qf_kv_rq_learn(&cv, &lp, &f, &e), QF_OK);
    CHECK_EQ_INT(qf_kv_rq_learn_klt(&cv, NULL, NULL, &lp, &f, &e), QF_OK);
    CHECK(f.klt != NULL && f.v_pred != NULL);
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = 2;
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK(c != NULL);
    if (!f.klt || !f.v_pred || !c) goto out;
    f.klt->eighths = true, f.k_prerope = true;
    int *bits[2] = {calloc((size_t)L, sizeof(int)), calloc((size_t)L, sizeof(int))};
    double *ones = calloc((size_t)L, sizeof(double));
    for (int l = 0; l < L; l++) ones[l] = 1 + l;
    const double *sens[2] = {ones, ones};
    qf_kv_rq_allocate_min(&f, sens, 2.5, 1, bits);
    qf_payload pl = {0};
    CHECK_EQ_INT(qf_kv_rq_payload(&f, (const int *const *)bits, 1, 4, &pl, &e), QF_OK);
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = 1 + 37 * i % 4000;
    int nvoc = hp->n_vocab;
    float *a = malloc(sizeof(float) * 16 * (size_t)nvoc), *b = malloc(sizeof(float) * 16 * (size_t)nvoc);
    const qf_payload_entry *pv = qf_payload_get(&pl, "v_pred"), *ke = qf_payload_get(&pl, "k_klt_enc");
    CHECK(pv != NULL && ke != NULL);
    if (!pv || !ke) goto out2;
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_OK);
    CHECK(c->kv.rq[1]->pred != pv->f32 && c->kv.rq[0]->klt_enc != ke->f32); /* copies */
    CHECK_EQ_INT(qf_decode(c, tok, 16, 0, a, 0, &e), QF_OK);
    CHECK_EQ_INT(qf_context_unbind(c, &e), QF_OK);
    CHECK_EQ_INT(qf_context_bind_payload_in_place(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_OK);
    CHECK(c->kv.rq[1]->pred == pv->f32 && c->kv.rq[0]->klt_enc == ke->f32); /* the payload's own */
    CHECK_EQ_INT(qf_decode(c, tok, 16, 0, b, 0, &e), QF_OK);
    CHECK(memcmp(a, b, sizeof(float) * 16 * (size_t)nvoc) == 0);
    CHECK_EQ_INT(qf_context_unbind(c, &e), QF_OK);
    /* checked in place all the same */
    static const char *const name[2] = {"v_pred", "k_klt_enc"}, *const why[2] = {"V predictor", "matrices"};
    for (int t = 0; t < 2; t++) {
        float *x = (float *)(t ? ke->f32 : pv->f32) + 3, keep = *x; /* layer 0: a non-f16 layer with 1 bit or more */
        *x = NAN;
        e = (qf_error){0};
        CHECK_EQ_INT(qf_context_bind_payload_in_place(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
        printf("  %s not finite, in place: %s\n", name[t], e.msg);
        CHECK(strstr(e.msg, why[t]) != NULL && !qf_context_bound(c, NULL));
        *x = keep;
    }
    CHECK_EQ_INT(qf_decode(c, tok, 16, 0, b, 0, &e), QF_OK); /* the plain cache again */
out2:
    free(a), free(b), free(ones), free(bits[0]), free(bits[1]);
    qf_payload_free(&pl);
out:
    qf_context_free(c);
    qf_kv_rq_fit_free(&f);
    for (int l = 0; l < L; l++) free(k[l]), free(v[l]);
    free(k), free(v), free(nk);
    qf_model_free(m);
}

int main(void) {
    RUN(klt_pack_unpack_bit_by_bit);
    RUN(klt_learner_widths_oracle_and_gain);
    RUN(klt_payload_binds_and_refuses_tampering);
    RUN(learn_threads_bit_identical);
    RUN(linear_fit_columns_independent);
    RUN(learn_gpu_without_one_is_a_clear_error);
    RUN(payload_update_matches_a_fresh_build);
    RUN(bind_in_place_same_logits_and_checks);
    return test_summary();
}
