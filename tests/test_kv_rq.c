/* test_kv_rq.c: the kv-rq row codec against a scalar oracle (explicit Hadamard matrix, brute-
 * force nearest level, bit-by-bit packing), its sizes and its Lloyd-Max fit; the rq cache mode
 * written and read back; and the generic exact sink/window facility of the KV cache: with
 * every position exact a q4_0 cache equals an f16 one, and token-by-token decode equals the
 * batched prefill (the per-(query, key) choice is the same in both). */
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/kv_rq.h"
#include "kernels/hadamard.h"
#include "qforge/artifact_bind.h"
#include "qforge/model.h"
#include "test.h"
#include "util/util.h"

static float gauss(uint64_t *s) {
    double u1 = ((double)(qf_xorshift64s(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(qf_xorshift64s(s) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

TEST(pack_unpack_bit_by_bit) {
    for (int bits = 1; bits <= 6; bits++) {
        uint8_t codes[64], back[64], packed[64];
        uint64_t s = 7 + bits;
        for (int i = 0; i < 64; i++) codes[i] = (uint8_t)(qf_xorshift64s(&s) % (1u << bits));
        qf_kv_rq_pack(codes, 64, bits, packed);
        for (int i = 0; i < 64; i++) /* oracle: bit j of code i is stream bit i*bits + j */
            for (int j = 0; j < bits; j++) {
                int sb = i * bits + j;
                CHECK(((packed[sb / 8] >> (sb % 8)) & 1) == ((codes[i] >> j) & 1));
            }
        qf_kv_rq_unpack(packed, 64, bits, back);
        CHECK(memcmp(codes, back, 64) == 0);
    }
}

TEST(row_sizes) {
    CHECK_EQ_INT(qf_kv_rq_row_bytes(64, 1), 9); /* format 2: 1-bit rows */
    CHECK_EQ_INT(qf_kv_rq_row_bytes(128, 1), 17);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(64, 0), 0);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(64, 2), 17);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(64, 3), 25);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(64, 4), 33);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(128, 3), 49);
    CHECK(qf_kv_rq_scale(0) == 0 && qf_kv_rq_scale(128) == 1.0f && qf_kv_rq_scale(136) == 2.0f);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(64, QF_KV_RQ_BITS_F16), 128);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(64, 5), 41);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(64, 7), 0);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(48, 3), 0);
    CHECK_EQ_INT(qf_kv_rq_row_bytes(4, 2), 0);
}

TEST(nearest_matches_brute_force) {
    float lv[8] = {-2.1f, -1.3f, -0.7f, -0.2f, 0.25f, 0.8f, 1.4f, 2.2f};
    uint64_t s = 3;
    for (int t = 0; t < 10000; t++) {
        float v = 3 * gauss(&s);
        int best = 0;
        for (int k = 1; k < 8; k++)
            if (fabsf(v - lv[k]) < fabsf(v - lv[best])) best = k;
        CHECK_EQ_INT(qf_kv_rq_nearest(lv, 8, v), best);
    }
}

/* the branch-free search against the binary search it replaced: every size 1..64, random
 * ascending levels, v random, exactly on a midpoint, on a level, outside the range, +-inf and
 * NaN: the same index */
TEST(nearest_branch_free_matches_binary_search) {
    uint64_t s = 11;
    float lv[64];
    int bad = 0, runs = 0;
    for (int n = 1; n <= 64; n++)
        for (int t = 0; t < 40; t++) {
            float x = -3.0f;
            for (int k = 0; k < n; k++) lv[k] = x += 0.01f + fabsf(gauss(&s));
            float vs[8] = {4 * gauss(&s), lv[0] - 1, lv[n - 1] + 1, lv[(n - 1) / 2], INFINITY, -INFINITY, NAN,
                           n > 1 ? 0.5f * (lv[n / 2 - 1] + lv[n / 2]) : lv[0]};
            for (int q = 0; q < 8; q++, runs++) bad += qf_kv_rq_nearest(lv, n, vs[q]) != qf_kv_rq_nearest_ref(lv, n, vs[q]);
        }
    printf("  %d searches, %d differ\n", runs, bad);
    CHECK_EQ_INT(bad, 0);
}

/* the oracle encoder: the same math with the explicit Hadamard matrix, brute-force nearest */
static void oracle_decode(const qf_kv_rq_codec *c, const uint8_t *row, float *out) {
    int hd = c->head_dim;
    float s = row[0] ? (float)pow(2.0, (row[0] - 128) / 8.0) : 0.0f, y[256], z[256];
    for (int i = 0; i < hd; i++) {
        int sb = i * c->bits, code = 0;
        for (int j = 0; j < c->bits; j++) code |= ((row[1 + (sb + j) / 8] >> ((sb + j) % 8)) & 1) << j;
        y[i] = s * c->levels[code];
    }
    qf_hadamard_ref(y, z, hd);
    for (int i = 0; i < hd; i++) out[i] = c->mean[i] + c->cs[i] * z[i];
}

TEST(encode_decode_matches_oracle_and_fit) {
    int hd = 64, n = 4000;
    uint64_t s = 11;
    float *x = malloc(sizeof(float) * (size_t)n * hd), mean[64], cs[64], ics[64];
    for (int i = 0; i < hd; i++) mean[i] = 0.3f * gauss(&s), cs[i] = (i % 3 ? 1.0f : -2.0f), ics[i] = 1.0f / cs[i];
    for (int r = 0; r < n; r++)
        for (int i = 0; i < hd; i++) x[(size_t)r * hd + i] = mean[i] + cs[i] * (i == 5 ? 4.0f : 1.0f) * gauss(&s);
    /* normalized rotated coordinates for the codebook, as the learner makes them */
    float *u = malloc(sizeof(float) * (size_t)n * hd);
    for (int r = 0; r < n; r++) {
        float *y = u + (size_t)r * hd;
        double ss = 0;
        for (int i = 0; i < hd; i++) y[i] = (x[(size_t)r * hd + i] - mean[i]) * ics[i];
        qf_hadamard(y, hd);
        for (int i = 0; i < hd; i++) ss += (double)y[i] * y[i];
        for (int i = 0; i < hd; i++) y[i] /= (float)sqrt(ss / hd);
    }
    double want[4] = {0.3634, 0.1175, 0.03454, 0.009497}; /* Lloyd-Max MSE of a unit Gaussian */
    for (int bits = 1; bits <= 4; bits++) {
        float lv[64];
        qf_error e = {0};
        float *tmp = malloc(sizeof(float) * (size_t)n * hd);
        memcpy(tmp, u, sizeof(float) * (size_t)n * hd);
        CHECK(qf_kv_rq_lloyd(tmp, (int64_t)n * hd, 1 << bits, 100, lv, &e) == QF_OK);
        free(tmp);
        for (int k = 1; k < (1 << bits); k++) CHECK(lv[k] > lv[k - 1]);
        qf_kv_rq_codec c = {.head_dim = hd, .bits = bits, .levels = lv, .mean = mean, .cs = cs, .inv_cs = ics};
        uint8_t row[64];
        float scratch[128], a[64], b[64];
        double num = 0, den = 0, worst = 0;
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * hd;
            qf_kv_rq_encode(&c, xr, scratch, row);
            qf_kv_rq_decode(&c, row, a);
            oracle_decode(&c, row, b);
            for (int i = 0; i < hd; i++) {
                worst = fmax(worst, fabs((double)a[i] - b[i]));
                double d = (xr[i] - a[i]) * ics[i];
                num += d * d;
                den += (double)(xr[i] - mean[i]) * (xr[i] - mean[i]) * ics[i] * ics[i];
            }
        }
        printf("  %d bits: rel. MSE %.5f (Gaussian Lloyd-Max %.5f), decode vs oracle %.2e\n", bits, num / den,
               want[bits - 1], worst);
        CHECK(worst < 1e-4);
        CHECK(num / den < want[bits - 1] * 1.2);
    }
    /* non-finite input: a zero row that decodes to the mean */
    float lv4[4] = {-1.5f, -0.45f, 0.45f, 1.5f}, bad[64], out[64], scratch[128];
    qf_kv_rq_codec c = {.head_dim = hd, .bits = 2, .levels = lv4, .mean = mean, .cs = cs, .inv_cs = ics};
    for (int i = 0; i < hd; i++) bad[i] = i == 3 ? NAN : 1.0f;
    uint8_t row[17];
    qf_kv_rq_encode(&c, bad, scratch, row);
    qf_kv_rq_decode(&c, row, out);
    for (int i = 0; i < hd; i++) CHECK(out[i] == mean[i]);
    free(x), free(u);
}

TEST(lloyd_rejects_bad_input) {
    float v[4] = {1, 2, NAN, 3}, lv[64];
    qf_error e = {0};
    CHECK_EQ_INT(qf_kv_rq_lloyd(v, 4, 2, 10, lv, &e), QF_ERR_ARG);
    CHECK_EQ_INT(qf_kv_rq_lloyd(v, 2, 4, 10, lv, &e), QF_ERR_ARG);
    CHECK_EQ_INT(qf_kv_rq_lloyd(v, 4, 128, 10, lv, &e), QF_ERR_ARG);
}

/* an rq stream spec with Gaussian Lloyd-Max levels, no centring or smoothing */
typedef struct {
    int bits[8];
    float levels[8 * 4 * 64], mean[8 * 4 * 128], cs[8 * 4 * 128];
} rq_spec_data;

static void rq_spec(rq_spec_data *d, int L, int H, int hd, const int *bits) {
    static const float g2[4] = {-1.510f, -0.4528f, 0.4528f, 1.510f};
    static const float g3[8] = {-2.152f, -1.344f, -0.756f, -0.2451f, 0.2451f, 0.756f, 1.344f, 2.152f};
    for (int l = 0; l < L; l++) {
        d->bits[l] = bits[l];
        for (int h = 0; h < H; h++)
            for (int k = 0; k < 64; k++)
                d->levels[(l * H + h) * 64 + k] = k < 4 && bits[l] == 2 ? g2[k] : k < 8 ? g3[k] : (float)k;
    }
    for (int i = 0; i < L * H * hd; i++) d->mean[i] = 0, d->cs[i] = 1;
}

TEST(rq_cache_mode_roundtrip_and_refusals) {
    qf_hparams hp = {0};
    hp.n_layer = 2, hp.n_head_kv = 2, hp.head_dim = 64;
    rq_spec_data d;
    static const int b32[2] = {3, 2};
    rq_spec(&d, 2, 2, 64, b32);
    qf_kv_stream_spec spec[2] = {
        {.mode = QF_KV_RQ, .rq_bits = d.bits, .rq_levels = d.levels, .rq_mean = d.mean, .rq_cs = d.cs},
        {.mode = QF_KV_F16}};
    qf_kv_cache kv;
    qf_error e = {0};
    CHECK(qf_kv_cache_init_spec(&kv, &hp, 16, spec, &e) == QF_OK);
    uint64_t s = 5;
    float x[16 * 2 * 64], y[16 * 64];
    for (int i = 0; i < 16 * 2 * 64; i++) x[i] = gauss(&s);
    for (int l = 0; l < 2; l++) {
        qf_kv_cache_write(&kv, 0, l, 0, 16, x);
        qf_kv_cache_read_head(&kv, 0, l, 1, 16, y);
        double num = 0, den = 0;
        for (int p = 0; p < 16; p++)
            for (int i = 0; i < 64; i++) {
                double a = x[(p * 2 + 1) * 64 + i], b = y[p * 64 + i];
                num += (a - b) * (a - b), den += a * a;
            }
        printf("  layer %d (%d bits): rel. MSE %.4f\n", l, d.bits[l], num / den);
        CHECK(num / den < (l ? 0.16 : 0.05));
    }
    /* bytes: K rows 25 + 17 bytes, V f16 128, per kv head */
    CHECK_NEAR(qf_kv_cache_bytes_per_token(&kv), 2.0 * (25 + 17 + 2 * 128), 1e-9);
    CHECK(qf_kv_cache_set_exact(&kv, 2, 4, &e) == QF_OK);
    CHECK_NEAR(qf_kv_cache_bytes_per_token(&kv), 2.0 * (25 + 17 + 2 * 128) + 2.0 * 2 * 2 * 64 * 2 * 6 / 16, 1e-9);
    CHECK_EQ_INT(qf_kv_cache_set_exact(&kv, 17, 0, &e), QF_ERR_ARG);
    CHECK_EQ_INT(qf_kv_cache_set_exact(&kv, 0, -1, &e), QF_ERR_ARG);
    qf_kv_cache_free(&kv);
    /* refusals */
    d.bits[1] = 5;
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 16, spec, &e), QF_ERR_ARG);
    d.bits[1] = 2;
    d.levels[64 + 1] = d.levels[64]; /* layer 0 head 1 not ascending */
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 16, spec, &e), QF_ERR_ARG);
    rq_spec(&d, 2, 2, 64, b32);
    d.cs[7] = 0;
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 16, spec, &e), QF_ERR_ARG);
    d.cs[7] = 1;
    spec[0].rq_mean = NULL;
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 16, spec, &e), QF_ERR_ARG);
    spec[0].rq_mean = d.mean;
    hp.head_dim = 48;
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, 16, spec, &e), QF_ERR_UNSUPPORTED);
    CHECK_EQ_INT(qf_kv_cache_init(&kv, &hp, 8, QF_KV_RQ, QF_KV_F16, &e), QF_ERR_ARTIFACT_NOT_CERTIFIED);
}


/* The V-from-K predictor of an rq cache: V rows code v - P k^, k^ the token's stored (pre-RoPE)
 * K rows; reading adds P k^ back. With V exactly linear in K the V error is the predictor times
 * the K error, far below coding V itself; refusals: a predictor without an rq pre-RoPE K stream,
 * a non-finite coefficient. */
TEST(rq_v_predictor_roundtrip_and_refusals) {
    qf_hparams hp = {0};
    hp.n_layer = 2, hp.n_head_kv = 2, hp.head_dim = 64;
    enum { HD = 128, NP = 16 };
    static rq_spec_data dk, dv;
    static const int b4[2] = {3, 3}, b2[2] = {2, 2};
    rq_spec(&dk, 2, 2, 64, b4);
    rq_spec(&dv, 2, 2, 64, b2);
    static float P[2 * HD * HD];
    uint64_t s = 21;
    for (int i = 0; i < HD * HD; i++) P[i] = 0.1f * gauss(&s); /* layer 0: V = P k; layer 1: no predictor */
    memset(P + HD * HD, 0, sizeof(float) * HD * HD);
    static float k[NP * HD], v[NP * HD], out[NP * 64];
    for (int i = 0; i < NP * HD; i++) k[i] = gauss(&s);
    for (int t = 0; t < NP; t++)
        for (int o = 0; o < HD; o++) {
            double a = 0;
            for (int i = 0; i < HD; i++) a += (double)P[o * HD + i] * k[t * HD + i];
            v[t * HD + o] = (float)a;
        }
    qf_kv_stream_spec spec[2] = {
        {.mode = QF_KV_RQ, .rq_bits = dk.bits, .rq_levels = dk.levels, .rq_mean = dk.mean, .rq_cs = dk.cs, .prerope = true},
        {.mode = QF_KV_RQ, .rq_bits = dv.bits, .rq_levels = dv.levels, .rq_mean = dv.mean, .rq_cs = dv.cs, .rq_pred = P}};
    qf_kv_cache kv;
    qf_error e = {0};
    CHECK(qf_kv_cache_init_spec(&kv, &hp, NP, spec, &e) == QF_OK);
    CHECK(kv.rq[1]->pred_on[0] && !kv.rq[1]->pred_on[1]);
    double err[2];
    for (int l = 0; l < 2; l++) {
        qf_kv_cache_write(&kv, 0, l, 0, NP, k);
        for (int p = 0; p < NP; p += 5) qf_kv_cache_write(&kv, 1, l, p, NP - p < 5 ? NP - p : 5, v + (size_t)p * HD);
        double num = 0, den = 0;
        for (int h = 0; h < 2; h++) {
            qf_kv_cache_read_head(&kv, 1, l, h, NP, out);
            for (int p = 0; p < NP; p++)
                for (int i = 0; i < 64; i++) {
                    double a = v[p * HD + h * 64 + i], b = out[p * 64 + i];
                    num += (a - b) * (a - b), den += a * a;
                }
        }
        err[l] = num / den;
    }
    /* oracle for layer 0: decode K and V rows by hand, V = P k^ + residual^ */
    double worst = 0;
    {
        float kh[HD], r[64], scratch[128];
        for (int p = 0; p < NP; p++) {
            for (int h = 0; h < 2; h++) {
                qf_kv_rq_codec ck = {.head_dim = 64, .bits = 3, .levels = dk.levels + h * 64, .mean = dk.mean, .cs = dk.cs};
                qf_kv_rq_decode(&ck, kv.data[0][0] + ((size_t)p * 2 + h) * kv.rq[0]->row_bytes[0], kh + h * 64);
            }
            qf_kv_cache_read_head(&kv, 1, 0, 1, NP, out);
            qf_kv_rq_codec cv = {.head_dim = 64, .bits = 2, .levels = dv.levels + 64, .mean = dv.mean, .cs = dv.cs};
            qf_kv_rq_decode(&cv, kv.data[1][0] + ((size_t)p * 2 + 1) * kv.rq[1]->row_bytes[0], r);
            for (int i = 0; i < 64; i++) {
                double a = r[i];
                for (int j = 0; j < HD; j++) a += (double)P[(64 + i) * HD + j] * kh[j];
                worst = fmax(worst, fabs(a - out[p * 64 + i]));
            }
            (void)scratch;
        }
    }
    printf("  V rel. MSE with the predictor %.4f, without (2-bit rows) %.4f; vs oracle %.2e\n", err[0], err[1], worst);
    CHECK(err[0] < 0.5 * err[1] && worst < 1e-4);
    /* bit for bit: each prediction is a float sum in order (the GPU's k_kv_rq_vres order), the
     * write codes v minus it, the read adds each kv head's partial sum to the decoded residual */
    {
        const struct qf_kv_rq_bind *rv = kv.rq[1];
        size_t rb = rv->row_bytes[0];
        float kh[HD], res[HD], sc[128], r[64];
        uint8_t row[64];
        int bad_w = 0, bad_r = 0;
        for (int p = 0; p < NP; p++) {
            for (int h = 0; h < 2; h++) {
                qf_kv_rq_codec ck = {.head_dim = 64, .bits = 3, .levels = dk.levels + h * 64, .mean = dk.mean, .cs = dk.cs};
                qf_kv_rq_decode(&ck, kv.data[0][0] + ((size_t)p * 2 + h) * kv.rq[0]->row_bytes[0], kh + h * 64);
            }
            for (int o = 0; o < HD; o++) {
                float a = 0;
                for (int j = 0; j < HD; j++) a += P[o * HD + j] * kh[j];
                res[o] = v[p * HD + o] - a;
            }
            for (int h = 0; h < 2; h++) {
                qf_kv_rq_codec c = {.head_dim = 64, .bits = rv->bits[0], .levels = rv->levels + h * QF_KV_RQ_MAX_LEVELS,
                                    .mean = rv->mean + h * 64, .cs = rv->cs + h * 64, .inv_cs = rv->inv_cs + h * 64};
                qf_kv_rq_encode(&c, res + h * 64, sc, row);
                bad_w += memcmp(row, kv.data[1][0] + ((size_t)p * 2 + h) * rb, rb) != 0;
                qf_kv_rq_decode(&c, row, r);
                qf_kv_cache_read_head(&kv, 1, 0, h, NP, out);
                for (int i = 0; i < 64; i++) {
                    float o = r[i];
                    for (int g = 0; g < 2; g++) {
                        float a = 0;
                        for (int q = 0; q < 64; q++) a += P[(h * 64 + i) * HD + g * 64 + q] * kh[g * 64 + q];
                        o += a;
                    }
                    bad_r += memcmp(&o, &out[p * 64 + i], sizeof o) != 0;
                }
            }
        }
        CHECK_EQ_INT(bad_w, 0);
        CHECK_EQ_INT(bad_r, 0);
    }
    /* the row route's V read with the K heads decoded once (forward.c's kv_gather_worker):
     * the same floats as qf_kv_cache_read_head, predicted layer or not */
    {
        static float kdec[2 * NP * 64], v1[NP * 64], v2[NP * 64];
        CHECK(qf_kv_cache_v_predicted(&kv, 0) && !qf_kv_cache_v_predicted(&kv, 1));
        size_t nd = 0;
        for (int l = 0; l < 2; l++) {
            for (int h = 0; h < 2; h++) qf_kv_cache_read_head(&kv, 0, l, h, NP, kdec + (size_t)h * NP * 64);
            for (int h = 0; h < 2; h++) {
                qf_kv_cache_read_head(&kv, 1, l, h, NP, v1);
                qf_kv_cache_read_head_vpred(&kv, l, h, NP, kdec, (size_t)NP * 64, v2);
                nd += memcmp(v1, v2, sizeof v1) != 0;
            }
        }
        CHECK(nd == 0);
    }
    qf_kv_cache_free(&kv);
    spec[0].prerope = false; /* a predictor needs pre-RoPE K rows */
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, NP, spec, &e), QF_ERR_ARG);
    spec[0].prerope = true;
    spec[0].mode = QF_KV_F16; /* ... stored as rq rows */
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, NP, spec, &e), QF_ERR_ARG);
    spec[0].mode = QF_KV_RQ;
    P[5] = NAN;
    CHECK_EQ_INT(qf_kv_cache_init_spec(&kv, &hp, NP, spec, &e), QF_ERR_ARG);
    P[5] = 0;
}

/* qf_kv_cache_write_pool: a batch's kv-rq rows encoded on 3 threads are the bytes of the one-
 * thread writer (each position on its own; V's predictor reads the same token's K), K and V,
 * with and without the predictor; small batches and other modes take the one-thread path. */
TEST(rq_pool_writer_same_bytes) {
    qf_hparams hp = {0};
    hp.n_layer = 2, hp.n_head_kv = 2, hp.head_dim = 64;
    enum { HD = 128, NP = 40 };
    static rq_spec_data dk, dv;
    static const int b3[2] = {3, 2}, b2[2] = {2, 3};
    rq_spec(&dk, 2, 2, 64, b3);
    rq_spec(&dv, 2, 2, 64, b2);
    static float P[2 * HD * HD], k[NP * HD], v[NP * HD];
    uint64_t s = 77;
    for (int i = 0; i < 2 * HD * HD; i++) P[i] = i < HD * HD ? 0.05f * gauss(&s) : 0.0f; /* layer 1: no predictor */
    for (int i = 0; i < NP * HD; i++) k[i] = gauss(&s), v[i] = gauss(&s);
    qf_kv_stream_spec spec[2] = {
        {.mode = QF_KV_RQ, .rq_bits = dk.bits, .rq_levels = dk.levels, .rq_mean = dk.mean, .rq_cs = dk.cs, .prerope = true},
        {.mode = QF_KV_RQ, .rq_bits = dv.bits, .rq_levels = dv.levels, .rq_mean = dv.mean, .rq_cs = dv.cs, .rq_pred = P}};
    qf_kv_cache a, b;
    qf_error e = {0};
    CHECK(qf_kv_cache_init_spec(&a, &hp, NP, spec, &e) == QF_OK);
    CHECK(qf_kv_cache_init_spec(&b, &hp, NP, spec, &e) == QF_OK);
    qf_pool *pool = qf_pool_create(3);
    CHECK(pool != NULL);
    for (int l = 0; pool && l < 2; l++) {
        qf_kv_cache_write(&a, 0, l, 0, NP, k);
        qf_kv_cache_write(&a, 1, l, 0, NP, v);
        qf_kv_cache_write_pool(&b, 0, l, 0, 30, k, pool); /* 30 on the threads, then 10 ... */
        qf_kv_cache_write_pool(&b, 0, l, 30, 10, k + 30 * HD, pool);
        qf_kv_cache_write_pool(&b, 1, l, 0, 30, v, pool);
        qf_kv_cache_write_pool(&b, 1, l, 30, 1, v + 30 * HD, pool); /* ... a single token: one thread */
        qf_kv_cache_write_pool(&b, 1, l, 31, 9, v + 31 * HD, pool);
        for (int st = 0; st < 2; st++) {
            size_t n = (size_t)NP * 2 * a.rq[st]->row_bytes[l];
            CHECK_MSG(!memcmp(a.data[st][l], b.data[st][l], n), "layer %d stream %d: pooled rows differ", l, st);
        }
    }
    qf_pool_free(pool);
    qf_kv_cache_free(&a);
    qf_kv_cache_free(&b);
}

/* ---- the exact sink/window facility on a real model ---- */

static qf_model *load(const char *rel) {
    const char *p = test_data(rel);
    if (!p) return NULL;
    qf_error e = {0};
    return qf_model_load(p, &e);
}

/* logits of n tokens in batches of `step`, the cache rebuilt as (mk, mv) with S sinks and R
 * window positions */
static bool g_ref; /* run the scalar reference route */
static float *logits(qf_model *m, const int32_t *t, int n, qf_kv_mode mk, qf_kv_mode mv, int S, int R, int step) {
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = 2, cp.kv_k = mk, cp.kv_v = mv, cp.reference = g_ref;
    qf_error e = {0};
    qf_context *c = qf_context_new(m, &cp, &e);
    if (!c) return NULL;
    int V = qf_model_hparams(m)->n_vocab;
    float *lg = malloc((size_t)n * V * sizeof(float));
    if (qf_kv_cache_set_exact(&c->kv, S, R, &e)) goto fail;
    for (int i = 0; i < n; i += step) {
        int bs = n - i < step ? n - i : step;
        if (qf_decode(c, t + i, bs, i, lg + (size_t)i * V, 0, &e)) goto fail;
    }
    qf_context_free(c);
    return lg;
fail:
    fprintf(stderr, "  %s\n", e.msg);
    free(lg);
    qf_context_free(c);
    return NULL;
}

static double max_rel(const float *a, const float *b, size_t n) {
    double mx = 0, sc = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)a[i] - b[i])), sc = fmax(sc, fabs(a[i]));
    return mx / (sc > 0 ? sc : 1);
}

TEST(exact_window_all_exact_equals_f16_and_decode_equals_prefill) {
    qf_model *m = load("models/qforge-demo-11m-f16.gguf");
    if (!m) SKIP("demo model not in ../shared/data");
    int V = qf_model_hparams(m)->n_vocab, n = 40;
    int32_t t[40];
    uint64_t s = 9;
    for (int i = 0; i < n; i++) t[i] = (int32_t)(qf_xorshift64s(&s) % (uint64_t)V);
    size_t N = (size_t)n * V;
    float *f16 = logits(m, t, n, QF_KV_F16, QF_KV_F16, 0, 0, n);
    float *q4 = logits(m, t, n, QF_KV_Q4_0, QF_KV_Q4_0, 0, 0, n);
    float *all_sink = logits(m, t, n, QF_KV_Q4_0, QF_KV_Q4_0, 64, 0, n);
    float *all_win = logits(m, t, n, QF_KV_Q4_0, QF_KV_Q4_0, 0, 64, n);
    float *pre = logits(m, t, n, QF_KV_Q4_0, QF_KV_Q4_0, 3, 8, n);
    float *dec = logits(m, t, n, QF_KV_Q4_0, QF_KV_Q4_0, 3, 8, 1);
    float *mix = logits(m, t, n, QF_KV_Q4_0, QF_KV_Q4_0, 3, 8, 7);
    CHECK(f16 && q4 && all_sink && all_win && pre && dec && mix);
    if (f16 && q4 && all_sink && all_win && pre && dec && mix) {
        double e_q4 = max_rel(f16, q4, N), e_s = max_rel(f16, all_sink, N), e_w = max_rel(f16, all_win, N),
               e_d = max_rel(pre, dec, N), e_m = max_rel(pre, mix, N), e_p = max_rel(f16, pre, N);
        printf("  vs f16: q4_0 %.2e, all sinks %.2e, all window %.2e, S3/R8 %.2e; S3/R8 decode vs prefill %.2e, "
               "batches of 7 %.2e\n",
               e_q4, e_s, e_w, e_p, e_d, e_m);
        CHECK(e_s < 1e-4 && e_w < 1e-4);
        /* the fast route's summation order differs with the batch (and single tokens take the
         * quantized-activation matmuls), and a q4_0 rounding flip amplifies that: loose here,
         * exact on the reference route below */
        CHECK(e_d < 2e-2 && e_m < 1e-2);
        CHECK(e_p < e_q4 && e_p > e_s);
    }
    free(f16), free(q4), free(all_sink), free(all_win), free(pre), free(dec), free(mix);
    /* the reference route computes every token alike: the per-(t, p) choice is identical */
    g_ref = true;
    int nr = 24;
    float *rp = logits(m, t, nr, QF_KV_Q4_0, QF_KV_Q4_0, 2, 5, nr), *rd = logits(m, t, nr, QF_KV_Q4_0, QF_KV_Q4_0, 2, 5, 1),
          *rm = logits(m, t, nr, QF_KV_Q4_0, QF_KV_Q4_0, 2, 5, 7), *rq = logits(m, t, nr, QF_KV_Q4_0, QF_KV_Q4_0, 0, 0, nr);
    g_ref = false;
    CHECK(rp && rd && rm && rq);
    if (rp && rd && rm && rq) {
        size_t Nr = (size_t)nr * V;
        double a = max_rel(rp, rd, Nr), b = max_rel(rp, rm, Nr), q = max_rel(rp, rq, Nr);
        printf("  reference route, S2/R5: decode vs prefill %.2e, batches of 7 %.2e (vs no window %.2e)\n", a, b, q);
        CHECK(a < 1e-5 && b < 1e-5 && q > 1e-3);
    }
    free(rp), free(rd), free(rm), free(rq);
    qf_model_free(m);
}

/* A cache that stores K before RoPE (kv-rq format 2, kv-dict v2) rotates on read; its exact
 * sink copies must be the post-RoPE keys (forward.c hands them over after RoPE): with every
 * position a sink it equals the plain f16 cache, and a pre-RoPE f32 cache equals a plain one. */
static float *logits_prerope(qf_model *m, const int32_t *t, int n, qf_kv_mode mk, int S, int R, int step) {
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = 2, cp.kv_k = mk, cp.kv_v = mk, cp.reference = g_ref;
    qf_error e = {0};
    qf_context *c = qf_context_new(m, &cp, &e);
    if (!c) return NULL;
    int V = qf_model_hparams(m)->n_vocab;
    float *lg = malloc((size_t)n * V * sizeof(float));
    c->kv.k_prerope = true; /* the cache is empty: every K row written from here on is pre-RoPE */
    if (qf_kv_cache_set_exact(&c->kv, S, R, &e)) goto fail;
    for (int i = 0; i < n; i += step) {
        int bs = n - i < step ? n - i : step;
        if (qf_decode(c, t + i, bs, i, lg + (size_t)i * V, 0, &e)) goto fail;
    }
    qf_context_free(c);
    return lg;
fail:
    fprintf(stderr, "  %s\n", e.msg);
    free(lg);
    qf_context_free(c);
    return NULL;
}

TEST(prerope_cache_sinks_are_post_rope) {
    qf_model *m = load("models/qforge-demo-11m-f16.gguf");
    if (!m) SKIP("demo model not in ../shared/data");
    int V = qf_model_hparams(m)->n_vocab, n = 24;
    int32_t t[24];
    uint64_t s = 13;
    for (int i = 0; i < n; i++) t[i] = (int32_t)(qf_xorshift64s(&s) % (uint64_t)V);
    size_t N = (size_t)n * V;
    g_ref = true;
    float *f32 = logits(m, t, n, QF_KV_F32, QF_KV_F32, 0, 0, n), *f16 = logits(m, t, n, QF_KV_F16, QF_KV_F16, 0, 0, n);
    float *p32 = logits_prerope(m, t, n, QF_KV_F32, 0, 0, n);
    float *sinks = logits_prerope(m, t, n, QF_KV_Q4_0, 64, 0, n), *sinks_dec = logits_prerope(m, t, n, QF_KV_Q4_0, 64, 0, 1);
    float *q4 = logits_prerope(m, t, n, QF_KV_Q4_0, 0, 0, n);
    g_ref = false;
    CHECK(f32 && f16 && p32 && sinks && sinks_dec && q4);
    if (f32 && f16 && p32 && sinks && sinks_dec && q4) {
        double a = max_rel(f32, p32, N), b = max_rel(f16, sinks, N), c = max_rel(f16, sinks_dec, N), d = max_rel(f16, q4, N);
        printf("  pre-RoPE f32 vs f32 %.2e; pre-RoPE q4_0 all sinks vs f16: prefill %.2e, decode %.2e (no sinks %.2e)\n",
               a, b, c, d);
        CHECK(a < 1e-5 && b < 1e-4 && c < 1e-4 && d > 1e-3);
    }
    free(f32), free(f16), free(p32), free(sinks), free(sinks_dec), free(q4);
    qf_model_free(m);
}

/* A kv-rq payload for the demo model (6 layers, 2 kv heads, head_dim 64): format fmt, 'k_prerope'
 * = prerope (-1: absent), every row `bits` wide. */
static void rq_payload(qf_payload *pl, int fmt, int prerope, int bits) {
    enum { L = 6, H = 2, D = 64 };
    static float lv[L * H * 64], mean[L * H * D], cs[L * H * D];
    for (int i = 0; i < L * H * 64; i++) lv[i] = (float)(i % 64) - 31.5f;
    for (int i = 0; i < L * H * D; i++) mean[i] = 0.01f * (float)(i % 7), cs[i] = i % 2 ? 1.0f : -1.0f;
    uint8_t b[L];
    memset(b, bits, sizeof b);
    int64_t sh1[1] = {L}, shl[3] = {L, H, 64}, shv[3] = {L, H, D};
    qf_error e = {0};
    memset(pl, 0, sizeof *pl);
    qf_payload_add_int(pl, "format", fmt, &e);
    qf_payload_add_string(pl, "rotation", "hadamard", &e);
    qf_payload_add_int(pl, "n_sink", 1, &e);
    qf_payload_add_int(pl, "n_window", 4, &e);
    if (prerope >= 0) qf_payload_add_int(pl, "k_prerope", prerope, &e);
    for (int s = 0; s < 2; s++) {
        qf_payload_add_u8(pl, s ? "v_bits" : "k_bits", b, 1, sh1, &e);
        qf_payload_add_f32(pl, s ? "v_levels" : "k_levels", lv, 3, shl, &e);
        qf_payload_add_f32(pl, s ? "v_mean" : "k_mean", mean, 3, shv, &e);
        qf_payload_add_f32(pl, s ? "v_cs" : "k_cs", cs, 3, shv, &e);
    }
}

TEST(rq_payload_format_versions) {
    qf_model *m = load("models/qforge-demo-11m-f16.gguf");
    if (!m) SKIP("demo model not in ../shared/data");
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = 1;
    qf_error e = {0};
    qf_context *c = qf_context_new(m, &cp, &e);
    CHECK(c != NULL);
    if (!c) {
        qf_model_free(m);
        return;
    }
    qf_payload pl;
    rq_payload(&pl, 2, 1, 1); /* format 2: pre-RoPE keys, 1-bit rows */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_OK);
    CHECK(c->kv.k_prerope && c->kv.rq[0] && c->kv.rq[0]->bits[0] == 1 && c->kv.rq[0]->row_bytes[0] == 9);
    CHECK_NEAR(qf_artifact_bits_per_element(QF_ARTIFACT_KV_RQ, &pl, qf_model_hparams(m), 512), 1.125 + 16.0 * 5 / 512,
               1e-9);
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_EQ_INT(qf_decode(c, tok, 8, 0, NULL, 8, &e), QF_OK);
    qf_payload_free(&pl);
    rq_payload(&pl, 1, -1, 2); /* an old format-1 artifact still binds: keys after RoPE */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_OK);
    CHECK(!c->kv.k_prerope);
    qf_payload_free(&pl);
    rq_payload(&pl, 1, -1, 1); /* format 1 has no 1-bit rows */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
    CHECK(strstr(e.msg, "format 1") != NULL);
    qf_payload_free(&pl);
    rq_payload(&pl, 2, -1, 2); /* format 2 without 'k_prerope' */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
    CHECK(strstr(e.msg, "k_prerope") != NULL);
    qf_payload_free(&pl);
    rq_payload(&pl, 2, 3, 2); /* 'k_prerope' out of range */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
    qf_payload_free(&pl);
    {
        static float pv[6 * 128 * 128];
        int64_t shp[3] = {6, 128, 128}, bad[3] = {6, 128, 64};
        rq_payload(&pl, 2, 1, 2); /* a V predictor binds with pre-RoPE keys */
        qf_payload_add_f32(&pl, "v_pred", pv, 3, shp, &e);
        CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_OK);
        CHECK(c->kv.rq[1] && c->kv.rq[1]->pred != NULL);
        qf_payload_free(&pl);
        rq_payload(&pl, 2, 0, 2); /* ... not with post-RoPE keys */
        qf_payload_add_f32(&pl, "v_pred", pv, 3, shp, &e);
        CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
        CHECK(strstr(e.msg, "v_pred") != NULL);
        qf_payload_free(&pl);
        rq_payload(&pl, 2, 1, 2); /* wrong shape */
        qf_payload_add_f32(&pl, "v_pred", pv, 3, bad, &e);
        CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_CORRUPT);
        qf_payload_free(&pl);
    }
    rq_payload(&pl, 4, 1, 2); /* a newer format */
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_VERSION);
    CHECK(strstr(e.msg, "formats 1, 2 and 3") != NULL);
    qf_payload_free(&pl);
    rq_payload(&pl, 0, 1, 2);
    CHECK_EQ_INT(qf_context_bind_payload(c, QF_ARTIFACT_KV_RQ, &pl, &e), QF_ERR_ARTIFACT_VERSION);
    qf_payload_free(&pl);
    qf_context_free(c);
    qf_model_free(m);
}

/* qf_artifact_table_bytes: every array of the payload (f32 4 bytes, u8 / i8 1), no scalar or
 * string; NaN for awq and a NULL payload */
TEST(table_bytes_counts_the_arrays) {
    qf_payload p = {0};
    qf_error e;
    float f[6] = {0};
    uint8_t u[5] = {0};
    int8_t i8[3] = {0};
    CHECK_EQ_INT(qf_payload_add_f32(&p, "a", f, 2, (int64_t[]){2, 3}, &e), QF_OK);
    CHECK_EQ_INT(qf_payload_add_u8(&p, "b", u, 1, (int64_t[]){5}, &e), QF_OK);
    CHECK_EQ_INT(qf_payload_add_i8(&p, "c", i8, 1, (int64_t[]){3}, &e), QF_OK);
    CHECK_EQ_INT(qf_payload_add_int(&p, "n", 7, &e), QF_OK);
    CHECK_EQ_INT(qf_payload_add_float(&p, "x", 0.5, &e), QF_OK);
    CHECK_EQ_INT(qf_payload_add_string(&p, "s", "a long string that is not a table", &e), QF_OK);
    CHECK(qf_artifact_table_bytes(QF_ARTIFACT_KV_RQ, &p) == 6 * 4 + 5 + 3);
    CHECK(qf_artifact_table_bytes(QF_ARTIFACT_KV_INT8, &p) == 32);
    CHECK(isnan(qf_artifact_table_bytes(QF_ARTIFACT_AWQ, &p)));
    CHECK(isnan(qf_artifact_table_bytes(QF_ARTIFACT_KV_RQ, NULL)));
    qf_payload_free(&p);
    CHECK(qf_artifact_table_bytes(QF_ARTIFACT_KV_DICT, &p) == 0);
}

int main(void) {
    RUN(pack_unpack_bit_by_bit);
    RUN(row_sizes);
    RUN(nearest_matches_brute_force);
    RUN(nearest_branch_free_matches_binary_search);
    RUN(encode_decode_matches_oracle_and_fit);
    RUN(lloyd_rejects_bad_input);
    RUN(rq_cache_mode_roundtrip_and_refusals);
    RUN(rq_v_predictor_roundtrip_and_refusals);
    RUN(rq_pool_writer_same_bytes);
    RUN(exact_window_all_exact_equals_f16_and_decode_equals_prefill);
    RUN(prerope_cache_sinks_are_post_rope);
    RUN(rq_payload_format_versions);
    RUN(table_bytes_counts_the_arrays);
    return test_summary();
}
