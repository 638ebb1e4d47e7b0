/* test_kv_rq_lin.c: kv-rq rows in the coefficient domain (engine.h, kv_rq_lin.c) against the
 * row decoder (qf_kv_cache_read_head): every (stream, layer, kv head) of caches with format-3
 * (random transforms, per-coordinate widths with dropped coordinates, a fractional rate) and
 * format-2 (Hadamard) rows, f16 layers on either stream, V predicted from K on some layers;
 * decoding runs of coefficient rows equals decoding each row, and the linear maps applied to
 * weighted coefficient sums equal the weighted sums of decoded rows (prediction included). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "qforge/model.h"
#include "engine/kv_rq.h"
#include "engine/kv_rq_klt.h"
#include "kernels/gemm.h"
#include "qforge/quant.h"
#include "test.h"
#include "util/util.h"

enum { L = 4, H = 2, D = 64, HD = H * D, NP = 70, LMAX = 6 };

static float gauss(uint64_t *s) {
    double u1 = ((double)(qf_xorshift64s(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(qf_xorshift64s(s) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

typedef struct {
    int bits[LMAX];
    float levels[LMAX * H * 64], mean[LMAX * H * D], cs[LMAX * H * D];
    float enc[LMAX * H * D * D], dec[LMAX * H * D * D], sigma[LMAX * H * D], klv[LMAX * H * D * 64];
    uint8_t width[LMAX * H * D];
} stream_data;

/* one stream: layer `f16` kept as halves; format 3 when klt (layer 1 at 1.5 bits, others at 2:
 * random widths 0..4, so some coordinates are dropped, many below the last coded one; prefix:
 * sorted, widest first, so the coded coordinates are 0..m-1, as they mostly are after a KLT),
 * else format 2 at 3 bits */
static void stream_fill(stream_data *d, bool klt, bool prefix, int f16, uint64_t *s) {
    for (int l = 0; l < L; l++) d->bits[l] = l == f16 ? QF_KV_RQ_BITS_F16 : klt ? (l == 1 ? 32 + 12 : 2) : 3;
    for (int i = 0; i < L * H * 64; i++) d->levels[i] = -2.0f + 0.5f * (float)(i % 64) + 0.01f * (float)(i % 3);
    for (int i = 0; i < L * H * D; i++) {
        d->mean[i] = 0.3f * gauss(s);
        d->cs[i] = (i % 5 ? 1.0f : -1.0f) * (0.5f + 0.1f * (float)(i % 7));
        d->sigma[i] = 0.2f + 0.05f * (float)(i % 11);
    }
    for (int i = 0; i < L * H * D * D; i++) d->enc[i] = gauss(s) / 8, d->dec[i] = gauss(s) / 8;
    for (int i = 0; i < L * H * D * 64; i++) d->klv[i] = -3.0f + 0.1f * (float)(i % 64);
    for (int l = 0; l < L; l++) {
        int total = qf_kv_rq_klt_eighths(d->bits[l]) * D / 8;
        for (int h = 0; h < H; h++) {
            uint8_t *w = d->width + ((size_t)l * H + h) * D;
            memset(w, 0, D);
            for (int left = total; left > 0;) { /* random coordinates up to width 4 */
                int j = (int)(qf_xorshift64s(s) % D);
                if (w[j] < 4) w[j]++, left--;
            }
            for (int i = 0; prefix && i < D; i++) /* insertion sort, descending */
                for (int j = i; j > 0 && w[j] > w[j - 1]; j--) {
                    uint8_t x = w[j];
                    w[j] = w[j - 1], w[j - 1] = x;
                }
        }
    }
}

static qf_kv_stream_spec spec_of(const stream_data *d, bool klt) {
    qf_kv_stream_spec sp = {.mode = QF_KV_RQ, .rq_bits = d->bits, .rq_levels = d->levels, .rq_mean = d->mean, .rq_cs = d->cs};
    if (klt)
        sp.rq_klt_enc = d->enc, sp.rq_klt_dec = d->dec, sp.rq_klt_sigma = d->sigma, sp.rq_klt_levels = d->klv,
        sp.rq_klt_width = d->width;
    return sp;
}

static double check_cache(bool klt, bool prefix, uint64_t seed) {
    static stream_data dk, dv;
    static float P[L * HD * HD], k[NP * HD], v[NP * HD];
    uint64_t s = seed;
    stream_fill(&dk, klt, prefix, 2, &s);
    stream_fill(&dv, klt, prefix, 3, &s);
    for (int i = 0; i < L * HD * HD; i++) P[i] = (i / (HD * HD)) == 1 ? 0.0f : 0.05f * gauss(&s); /* layer 1: none */
    for (int i = 0; i < NP * HD; i++) k[i] = gauss(&s), v[i] = gauss(&s);
    qf_kv_stream_spec spec[2] = {spec_of(&dk, klt), spec_of(&dv, klt)};
    spec[0].prerope = true, spec[1].rq_pred = P;
    qf_hparams hp = {0};
    hp.n_layer = L, hp.n_head_kv = H, hp.head_dim = D;
    qf_kv_cache kv;
    qf_error e = {0};
    CHECK(qf_kv_cache_init_spec(&kv, &hp, NP, spec, &e) == QF_OK);
    CHECK(qf_kv_rq_lin_build(&kv, &e) == QF_OK);
    if (!kv.rq_lin) return INFINITY;
    double worst = 0, scale = 0;
    static float ref[NP * D], got[NP * D], yk[NP * HD], y[NP * D], w[NP], scratch[NP * D + HD + D];
    for (int p = 0; p < NP; p++) w[p] = (float)(qf_xorshift64s(&s) % 1000) / 1000.0f;
    for (int l = 0; l < L; l++) {
        qf_kv_cache_write(&kv, 0, l, 0, NP, k);
        qf_kv_cache_write(&kv, 1, l, 0, NP, v);
        int kd = qf_kv_rq_lin_kdim(&kv, l);
        for (int g = 0; g < H; g++)
            qf_kv_rq_lin_coef(&kv, 0, l, g, 0, NP, yk + qf_kv_rq_lin_koff(&kv, l, g), (size_t)kd);
        CHECK(qf_kv_rq_lin_pred_on(&kv, l) == (l != 1));
        for (int st = 0; st < 2; st++)
            for (int h = 0; h < H; h++) {
                int m = qf_kv_rq_lin_dim(&kv, st, l, h);
                CHECK(m >= 1 && m <= D);
                qf_kv_cache_read_head(&kv, st, l, h, NP, ref);
                /* runs of rows: from the K coefficient row or a separate one, in two pieces */
                const float *yy = st ? y : yk + qf_kv_rq_lin_koff(&kv, l, h);
                size_t ld = st ? (size_t)D : (size_t)kd;
                if (st) {
                    qf_kv_rq_lin_coef(&kv, 1, l, h, 0, 33, y, ld);
                    qf_kv_rq_lin_coef(&kv, 1, l, h, 33, NP - 33, y + 33 * ld, ld);
                }
                qf_kv_rq_lin_decode(&kv, st, l, h, NP, yy, ld, got);
                if (st) qf_kv_rq_lin_pred(&kv, l, h, NP, yk, (size_t)kd, got, scratch);
                for (int i = 0; i < NP * D; i++) {
                    worst = fmax(worst, fabs((double)got[i] - ref[i]));
                    scale = fmax(scale, fabs((double)ref[i]));
                }
                /* weighted sums: sum_p w_p row_p from the coefficient sums */
                double want[D] = {0}, W = 0;
                float ysum[D] = {0}, yks[HD] = {0}, out[D];
                for (int p = 0; p < NP; p++) {
                    W += w[p];
                    for (int i = 0; i < D; i++) want[i] += (double)w[p] * ref[p * D + i];
                    for (int i = 0; i < m; i++) ysum[i] += w[p] * yy[p * ld + i];
                    for (int i = 0; i < kd; i++) yks[i] += w[p] * yk[p * kd + i];
                }
                qf_kv_rq_lin_apply(&kv, st, l, h, ysum, (float)W, out);
                if (st) qf_kv_rq_lin_apply_pred(&kv, l, h, yks, (float)W, out, scratch);
                for (int i = 0; i < D; i++) worst = fmax(worst, fabs(out[i] - want[i]) / NP);
            }
    }
    /* qf_kv_cache_read_pos: one row, prediction included */
    float one[D];
    qf_kv_cache_read_pos(&kv, 1, 0, 1, 41, one);
    qf_kv_cache_read_head(&kv, 1, 0, 1, NP, ref);
    CHECK(memcmp(one, ref + 41 * D, sizeof one) == 0);
    qf_kv_cache_free(&kv);
    CHECK(kv.rq_lin == NULL);
    printf("  %s rows%s: worst |lin - row decoder| %.2e (values up to %.2f)\n", klt ? "format-3" : "format-2",
           prefix ? " (coded coordinates a prefix)" : "", worst, scale);
    return worst / scale;
}

TEST(lin_matches_row_decoder_format3) { CHECK(check_cache(true, false, 7) < 2e-6); }
TEST(lin_matches_row_decoder_format3_prefix) { CHECK(check_cache(true, true, 5) < 2e-6); }
TEST(lin_matches_row_decoder_format2) { CHECK(check_cache(false, false, 11) < 2e-6); }

/* only caches with both streams kv-rq get the tables */
TEST(lin_needs_two_rq_streams) {
    static stream_data dk;
    uint64_t s = 3;
    stream_fill(&dk, false, false, 2, &s);
    qf_kv_stream_spec spec[2] = {spec_of(&dk, false), {.mode = QF_KV_F16}};
    qf_hparams hp = {0};
    hp.n_layer = L, hp.n_head_kv = H, hp.head_dim = D;
    qf_kv_cache kv;
    qf_error e = {0};
    CHECK(qf_kv_cache_init_spec(&kv, &hp, 8, spec, &e) == QF_OK);
    CHECK(qf_kv_rq_lin_build(&kv, &e) == QF_OK && kv.rq_lin == NULL);
    qf_kv_cache_free(&kv);
}

/* The forward pass over a kv-rq cache on the demo model (6 layers, 2 kv heads, head_dim 64):
 * format-3 rows with an identity transform at 6 bits and f16 layers (layer 0 codes K and V),
 * pre-RoPE K, V predicted from K, one sink and a 4-token window. 40 prompt tokens in one
 * batch, then 8 decode steps, under every route (rows: the row decoder; explicit: GEMM
 * decoding; coef: V attention over coefficients; auto: explicit for the prompt, coef for the
 * steps). Layer 0's cache rows are the same bytes under every route (they depend on the
 * embeddings only), so its attention output must agree to rounding; the logits agree loosely,
 * since a rounding difference in a hidden state may move a code (or an int8 activation of the
 * decode matvec) in a later layer. */
typedef struct {
    float *att0; /* [n][n_head * head_dim]: layer 0's attention output */
    int pos, dq;
} att_tap;

static void on_act(void *user, int layer, qf_act_site site, int n_tok, int dim, const float *x) {
    att_tap *a = user;
    if (layer != 0 || site != QF_ACT_ATTN_OUT) return;
    memcpy(a->att0 + (size_t)a->pos * a->dq, x, (size_t)n_tok * dim * sizeof(float));
}

/* how many of the n floats of a and b differ in their bits (routes that must agree bit for bit) */
static size_t bits_differ(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, 4) != 0;
    return d;
}

static bool g_canon;   /* route_logits: the canonical arithmetic */
static int g_threads = 2;
static float *route_logits(qf_model *m, const stream_data *dk, const stream_data *dv, const float *P, int route,
                           const int32_t *t, int n_prompt, int n, float *att0) {
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 64, cp.n_threads = g_threads, cp.canonical = g_canon;
    qf_error e = {0};
    qf_context *c = qf_context_new(m, &cp, &e);
    if (!c) return NULL;
    const qf_hparams *hp = qf_model_hparams(m);
    qf_kv_stream_spec spec[2] = {spec_of(dk, true), spec_of(dv, true)};
    spec[0].prerope = true, spec[1].rq_pred = P;
    qf_kv_cache fresh;
    int V = hp->n_vocab;
    float *lg = malloc((size_t)n * V * sizeof(float));
    att_tap at = {.att0 = att0, .dq = hp->n_head * hp->head_dim};
    qf_tap tap = {.user = &at, .on_act = on_act};
    qf_context_set_tap(c, &tap);
    if (qf_kv_cache_init_spec(&fresh, hp, cp.n_ctx, spec, &e)) goto fail;
    if (qf_kv_cache_set_exact(&fresh, 1, 4, &e)) {
        qf_kv_cache_free(&fresh);
        goto fail;
    }
    qf_kv_cache_free(&c->kv);
    c->kv = fresh;
    c->params.kv_k = c->params.kv_v = QF_KV_RQ;
    c->rq_route = route;
    if (g_canon && !qf_context_canonical(c)) {
        snprintf(e.msg, sizeof e.msg, "a canonical kv-rq context does not say so");
        goto fail;
    }
    if (qf_decode(c, t, n_prompt, 0, lg, 0, &e)) goto fail;
    for (int i = n_prompt; i < n; i++) {
        at.pos = i;
        if (qf_decode(c, t + i, 1, i, lg + (size_t)i * V, 0, &e)) goto fail;
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
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num = fmax(num, fabs((double)a[i] - b[i])), den = fmax(den, fabs((double)b[i]));
    return num / den;
}

static stream_data g_dk, g_dv;
static float g_P[LMAX * HD * HD];

TEST(forward_routes_agree) {
    const char *path = test_data("models/qforge-demo-11m-f16.gguf");
    if (!path) SKIP("demo model not found");
    qf_error e = {0};
    qf_model *m = qf_model_load(path, &e);
    CHECK(m != NULL);
    if (!m) return;
    const qf_hparams *hp = qf_model_hparams(m);
    CHECK(hp->n_layer == LMAX && hp->n_head_kv == H && hp->head_dim == D);
    stream_data *const pk = &g_dk, *const pv = &g_dv;
#define dk (*pk)
#define dv (*pv)
    float *const P = g_P;
    uint64_t s = 17;
    for (int st = 0; st < 2; st++) {
        stream_data *d = st ? &dv : &dk;
        for (int l = 0; l < LMAX; l++) d->bits[l] = l % (2 + st) ? QF_KV_RQ_BITS_F16 : 6; /* K 0 2 4, V 0 3 coded */
        for (int i = 0; i < LMAX * H * 64; i++) d->levels[i] = -3.0f + 6.0f * (float)(i % 64) / 63;
        for (int i = 0; i < LMAX * H * D; i++) d->mean[i] = 0.1f * gauss(&s), d->cs[i] = 1, d->sigma[i] = 1, d->width[i] = 6;
        memset(d->enc, 0, sizeof d->enc);
        for (int lh = 0; lh < LMAX * H; lh++)
            for (int i = 0; i < D; i++) d->enc[((size_t)lh * D + i) * D + i] = 1;
        memcpy(d->dec, d->enc, sizeof d->enc);
        for (int i = 0; i < LMAX * H * D * 64; i++) d->klv[i] = -3.0f + 6.0f * (float)(i % 64) / 63;
    }
    for (int i = 0; i < LMAX * HD * HD; i++) P[i] = 0.02f * gauss(&s);
    enum { NR = 4 };
    static const int route[NR] = {QF_RQ_ROUTE_ROWS, QF_RQ_ROUTE_EXPLICIT, QF_RQ_ROUTE_COEF, QF_RQ_ROUTE_AUTO};
    static const char *const name[NR] = {"rows", "explicit", "coef", "auto"};
    int V = hp->n_vocab, n = 48, np = 40, dq = hp->n_head * hp->head_dim;
    int32_t t[48];
    for (int i = 0; i < n; i++) t[i] = (int32_t)(qf_xorshift64s(&s) % (uint64_t)V);
    float *lg[NR], *att[NR];
    bool ok = true;
    for (int r = 0; r < NR; r++) {
        att[r] = calloc((size_t)n * dq, sizeof(float));
        lg[r] = att[r] ? route_logits(m, &dk, &dv, P, route[r], t, np, n, att[r]) : NULL;
        ok &= lg[r] != NULL;
    }
    CHECK(ok);
    for (int r = 1; r < NR && ok; r++) {
        double a = max_rel(att[r], att[0], (size_t)n * dq), g = max_rel(lg[r], lg[0], (size_t)n * V);
        printf("  %-8s vs rows: layer 0 attention %.2e, logits %.2e\n", name[r], a, g);
        CHECK(a < 1e-5 && g < 1e-2);
    }
    /* the coefficient route's one-query steps score the keys inside the gather (att_job.kfused,
     * each run decoded into scratch, RoPE and all): the same bits as QF_RQ_NOFUSE's decode into
     * kbuf and qf_vec_rows_dot once per query head, the sink and window rows included */
    if (ok) {
        float *an = calloc((size_t)n * dq, sizeof(float)), *ln = NULL;
        setenv("QF_RQ_NOFUSE", "1", 1);
        if (an) ln = route_logits(m, &dk, &dv, P, QF_RQ_ROUTE_COEF, t, np, n, an);
        unsetenv("QF_RQ_NOFUSE");
        CHECK(ln != NULL);
        if (ln) {
            const size_t dl = bits_differ(ln, lg[2], (size_t)n * V);
            const size_t da = bits_differ(an, att[2], (size_t)n * dq);
            printf("  coef, keys scored in the gather vs QF_RQ_NOFUSE: %zu of %zu logits, %zu of %zu attention "
                   "outputs differ\n", dl, (size_t)n * V, da, (size_t)n * dq);
            CHECK(dl == 0 && da == 0);
        }
        free(an), free(ln);
    }
    /* and its V coefficient sums take a kv head's query heads in one product (att_job.vgroup: the
     * one-query steps, and a 16-token prompt whose gq x 16 rows fit one block; a 40-token prompt
     * does not): the same bits as QF_RQ_NOBATCH's product per query head */
    for (int v = 0; v < 2 && ok; v++) {
        const int npv = v ? 16 : np;
        float *ab[2] = {calloc((size_t)n * dq, sizeof(float)), calloc((size_t)n * dq, sizeof(float))}, *lb[2] = {0};
        for (int b = 0; b < 2; b++) {
            if (b) setenv("QF_RQ_NOBATCH", "1", 1);
            if (ab[b]) lb[b] = route_logits(m, &dk, &dv, P, QF_RQ_ROUTE_COEF, t, npv, n, ab[b]);
            unsetenv("QF_RQ_NOBATCH");
        }
        CHECK(lb[0] != NULL && lb[1] != NULL);
        if (lb[0] && lb[1]) {
            const size_t dl = bits_differ(lb[0], lb[1], (size_t)n * V);
            const size_t da = bits_differ(ab[0], ab[1], (size_t)n * dq);
            printf("  coef, prompt %d, a kv head's query heads in one V sum vs QF_RQ_NOBATCH: %zu of %zu logits, "
                   "%zu of %zu attention outputs differ\n", npv, dl, (size_t)n * V, da, (size_t)n * dq);
            CHECK(dl == 0 && da == 0);
        }
        for (int b = 0; b < 2; b++) free(ab[b]), free(lb[b]);
    }
    /* and with both (att_job.cfused) V's coefficients are not stored: its codes are read a few rows
     * at a time for the weighted sums, K's from ykbuf once a layer (QF_RQ_KCODES: K's codes read
     * again too, ykbuf not written); qf_gemm_nn_f32_acc's pieces (QF_RQ_CSUB=5 makes several of
     * this short context): the same bits as QF_RQ_NOCFUSE's sums over ykbuf / vbuf */
    for (int v = 0; v < 3 && ok; v++) {
        float *ab[2] = {calloc((size_t)n * dq, sizeof(float)), calloc((size_t)n * dq, sizeof(float))}, *lb[2] = {0};
        if (v) setenv("QF_RQ_CSUB", "5", 1);
        if (v == 2) setenv("QF_RQ_KCODES", "1", 1);
        for (int b = 0; b < 2; b++) {
            if (b) setenv("QF_RQ_NOCFUSE", "1", 1);
            if (ab[b]) lb[b] = route_logits(m, &dk, &dv, P, QF_RQ_ROUTE_COEF, t, np, n, ab[b]);
            unsetenv("QF_RQ_NOCFUSE");
        }
        unsetenv("QF_RQ_CSUB"), unsetenv("QF_RQ_KCODES");
        CHECK(lb[0] != NULL && lb[1] != NULL);
        if (lb[0] && lb[1]) {
            const size_t dl = bits_differ(lb[0], lb[1], (size_t)n * V);
            const size_t da = bits_differ(ab[0], ab[1], (size_t)n * dq);
            printf("  coef, %s, sums from the codes vs QF_RQ_NOCFUSE: %zu of %zu logits, %zu of %zu attention "
                   "outputs differ\n", v == 2 ? "pieces of 5, K codes again" : v ? "pieces of 5 rows" : "one piece", dl, (size_t)n * V, da, (size_t)n * dq);
            CHECK(dl == 0 && da == 0);
        }
        for (int b = 0; b < 2; b++) free(ab[b]), free(lb[b]);
    }
    for (int r = 0; r < NR; r++) free(lg[r]), free(att[r]);
#undef dk
#undef dv
    /* the canonical arithmetic (kernels/canon.h) on the same kv-rq cache (format 3 rows, f16
     * layers, V predicted from pre-RoPE K, 1 sink and a window of 4): the same logits, bit for
     * bit, for any thread count, any batch split and any instruction set (the GPU's side:
     * test_cuda e2e_canonical) */
    g_canon = true;
    float *base = NULL;
    struct { const char *name; int threads, prompt, isa; } vs[] = {
        {"2 threads, prompt 40", 2, 40, 0}, {"1 thread", 1, 40, 0}, {"3 threads, token by token", 3, 1, 0},
        {"AVX2 only, prompt 17", 2, 17, 1}, {"no SIMD", 2, 40, 2}};
    for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) {
        g_threads = vs[v].threads;
        if (vs[v].isa == 1) qf_gemm_cap_isa(QF_GEMM_ISA_AVX2);
        if (vs[v].isa == 2) qf_quant_force_scalar(true);
        float *a = calloc((size_t)n * dq, sizeof(float));
        float *l = route_logits(m, &g_dk, &g_dv, g_P, QF_RQ_ROUTE_AUTO, t, vs[v].prompt, n, a);
        qf_gemm_cap_isa(QF_GEMM_ISA_AVX512), qf_quant_force_scalar(false);
        free(a);
        CHECK_MSG(l != NULL, "%s", vs[v].name);
        if (!l) continue;
        if (!base) {
            base = l;
            continue;
        }
        size_t diff = 0;
        for (size_t i = 0; i < (size_t)n * V; i++) diff += memcmp(&l[i], &base[i], 4) != 0;
        printf("  canonical, %-26s %zu of %zu logits differ from %s\n", vs[v].name, diff, (size_t)n * V, vs[0].name);
        CHECK(diff == 0);
        free(l);
    }
    free(base);
    g_canon = false, g_threads = 2;
    qf_model_free(m);
}

int main(void) {
    RUN(forward_routes_agree);
    RUN(lin_matches_row_decoder_format3);
    RUN(lin_matches_row_decoder_format3_prefix);
    RUN(lin_matches_row_decoder_format2);
    RUN(lin_needs_two_rq_streams);
    return test_summary();
}
