/* test_gate.c: the one gate predicate (qf_gate_judge) and what uses it: thresholds by rate,
 * two-sided ΔPPL, p99, the free baseline, NaN and non-finite PPL; the loader applies the same
 * predicate to a certificate's recorded numbers (old certificates keep their one-sided gate;
 * a certificate that claims a context it has no passing numbers for is refused); the certified
 * context list and the -c check ppl/generate run before binding. */
#include <math.h>
#include <string.h>

#include "qforge/artifact.h"
#include "qforge/forge.h"
#include "test.h"

static qf_gate_numbers good(void) {
    return (qf_gate_numbers){.ref_ppl = 10, .cand_ppl = 10.01, .delta_ppl = 0.001, .kld_mean = 0.0001,
                             .kld_p99 = 0.001, .top1 = 0.99, .has_baseline = true, .baseline_kld_mean = 0.0002};
}

TEST(gate_defaults_by_rate) {
    qf_gate g8 = qf_gate_default_for(QF_ARTIFACT_KV_INT8, 8.0), g4 = qf_gate_default_for(QF_ARTIFACT_KV_DICT, 4.0),
            g2 = qf_gate_default_for(QF_ARTIFACT_KV_DICT, 2.0), ga = qf_gate_default_for(QF_ARTIFACT_AWQ, 4.5);
    CHECK(g8.has_max_kld && g8.has_max_kld_p99 && g8.vs_baseline && g8.two_sided);
    CHECK(g8.max_kld < g4.max_kld && g4.max_kld < g2.max_kld);
    CHECK(g8.max_kld_p99 < g4.max_kld_p99 && g4.max_kld_p99 < g2.max_kld_p99);
    CHECK(!ga.has_max_kld && !ga.vs_baseline && ga.two_sided);
    /* a by_rate gate keeps what the user set, takes the rest from the rate */
    qf_gate u = qf_gate_default();
    CHECK(u.by_rate && u.vs_baseline && u.two_sided && !u.has_max_kld);
    u.has_max_kld = true, u.max_kld = 0.5;
    qf_gate r = qf_gate_resolve(&u, QF_ARTIFACT_KV_INT8, 8.0);
    CHECK(!r.by_rate && r.max_kld == 0.5 && r.has_max_kld_p99 && r.max_kld_p99 == g8.max_kld_p99);
    u.vs_baseline = false; /* --allow-worse-than-baseline */
    r = qf_gate_resolve(&u, QF_ARTIFACT_KV_INT8, 8.0);
    CHECK(!r.vs_baseline);
    r = qf_gate_resolve(&u, QF_ARTIFACT_KV_INT8, NAN); /* unknown rate: the loosest, still gated */
    CHECK(r.has_max_kld_p99 && r.max_kld_p99 == g2.max_kld_p99);
}

TEST(gate_judge_each_condition) {
    qf_gate g = qf_gate_default_for(QF_ARTIFACT_KV_INT8, 8.0);
    qf_gate_numbers n = good();
    char why[256];
    CHECK(qf_gate_judge(&g, &n, why, sizeof why) && why[0] == 0);
    CHECK(qf_gate_judge(&g, &n, NULL, 0));
    n.delta_ppl = -0.2; /* far below the reference: noise, refused two-sided */
    CHECK(!qf_gate_judge(&g, &n, why, sizeof why) && strstr(why, "delta PPL"));
    g.two_sided = false;
    CHECK(qf_gate_judge(&g, &n, why, sizeof why));
    g.two_sided = true;
    n = good(), n.kld_mean = 0.01;
    CHECK(!qf_gate_judge(&g, &n, why, sizeof why) && strstr(why, "mean KLD"));
    n = good(), n.kld_p99 = 0.5;
    CHECK(!qf_gate_judge(&g, &n, why, sizeof why) && strstr(why, "p99"));
    n = good(), n.kld_mean = 0.0003; /* under the threshold, over the baseline */
    CHECK(!qf_gate_judge(&g, &n, why, sizeof why) && strstr(why, "baseline") && strstr(why, "--allow-worse-than-baseline"));
    g.vs_baseline = false;
    CHECK(qf_gate_judge(&g, &n, why, sizeof why));
    g.vs_baseline = true;
    n = good(), n.has_baseline = false;
    CHECK(!qf_gate_judge(&g, &n, why, sizeof why) && strstr(why, "not measured"));
    n = good(), n.cand_ppl = INFINITY;
    CHECK(!qf_gate_judge(&g, &n, why, sizeof why) && strstr(why, "finite"));
    n = good(), n.ref_ppl = NAN;
    CHECK(!qf_gate_judge(&g, &n, NULL, 0));
    n = good(), n.kld_p99 = NAN;
    CHECK(!qf_gate_judge(&g, &n, NULL, 0));
    n = good(), n.baseline_kld_mean = NAN;
    CHECK(!qf_gate_judge(&g, &n, NULL, 0));
    n = good(), n.top1 = 0.5;
    g.has_min_top1 = true, g.min_top1 = 0.9;
    CHECK(!qf_gate_judge(&g, &n, why, sizeof why) && strstr(why, "top-1"));
}

/* a version-1 certificate as written before issue 15: no gate.* / baseline.* / ctx.* keys */
static void old_cert(qf_certificate *c) {
    qf_certificate_init(c, QF_ARTIFACT_KV_INT8);
    c->ref_ppl = 10, c->cand_ppl = 9.9, c->delta_ppl = -0.01, c->kld_mean = 0.001, c->kld_p99 = 0.01;
    c->top1_agreement = 0.99, c->gate_max_delta_ppl = 0.05, c->passed = true;
    qf_payload_add_int(&c->config, "eval_n_ctx", 256, NULL);
}

TEST(certificate_gate_old_and_new) {
    qf_certificate c;
    old_cert(&c);
    qf_gate g;
    qf_gate_numbers n;
    qf_certificate_gate(&c, &g, &n);
    CHECK(!g.two_sided && !g.vs_baseline && !g.has_max_kld_p99 && !n.has_baseline);
    CHECK(qf_certificate_meets_gate(&c)); /* one-sided: -1 % passes as it always did */
    c.cand_ppl = NAN;                     /* ... but a non-finite PPL now fails here too (issue 9) */
    CHECK(!qf_certificate_meets_gate(&c));
    c.cand_ppl = 9.9;
    int ctx[4];
    CHECK_EQ_INT(qf_certificate_certified_ctx(&c, ctx, 4), 1);
    CHECK_EQ_INT(ctx[0], 256);
    /* the new keys: two-sided, p99, the baseline */
    qf_payload_add_float(&c.config, "gate.max_kld_p99", 0.005, NULL);
    qf_payload_add_int(&c.config, "gate.two_sided", 1, NULL);
    qf_payload_add_int(&c.config, "gate.vs_baseline", 1, NULL);
    qf_payload_add_float(&c.config, "baseline.kld_mean", 0.002, NULL);
    qf_certificate_gate(&c, &g, &n);
    CHECK(g.two_sided && g.vs_baseline && g.has_max_kld_p99 && n.has_baseline && n.baseline_kld_mean == 0.002);
    CHECK(!qf_certificate_meets_gate(&c)); /* p99 0.01 > 0.005 */
    qf_certificate_free(&c);

    old_cert(&c);
    qf_payload_add_int(&c.config, "gate.two_sided", 1, NULL);
    qf_payload_add_int(&c.config, "gate.vs_baseline", 1, NULL);
    qf_payload_add_float(&c.config, "baseline.kld_mean", 0.0005, NULL); /* worse than the baseline */
    CHECK(!qf_certificate_meets_gate(&c));
    qf_certificate_free(&c);
}

TEST(certified_ctx_list_and_check) {
    qf_artifact a;
    memset(&a, 0, sizeof a);
    old_cert(&a.cert);
    qf_error e = {0};
    bool forced = true;
    CHECK(qf_artifact_check_ctx(&a, 256, false, &forced, &e) == QF_OK && !forced);
    CHECK(qf_artifact_check_ctx(&a, 64, false, NULL, &e) == QF_OK);
    CHECK_EQ_INT(qf_artifact_check_ctx(&a, 512, false, &forced, &e), QF_ERR_ARTIFACT_NOT_CERTIFIED);
    CHECK(strstr(e.msg, "512") && strstr(e.msg, "256") && strstr(e.msg, "--force-uncertified-ctx"));
    CHECK(qf_artifact_check_ctx(&a, 512, true, &forced, &e) == QF_OK && forced);
    qf_payload_add_string(&a.cert.config, "certified_ctx", "512,4096", NULL);
    CHECK_EQ_INT(qf_artifact_max_certified_ctx(&a), 4096);
    CHECK(qf_artifact_check_ctx(&a, 4096, false, NULL, &e) == QF_OK);
    CHECK_EQ_INT(qf_artifact_check_ctx(&a, 4097, false, NULL, &e), QF_ERR_ARTIFACT_NOT_CERTIFIED);
    /* claimed contexts need their own passing numbers */
    CHECK_EQ_INT(qf_artifact_check(&a, NULL, &e), QF_ERR_ARTIFACT_NOT_CERTIFIED);
    CHECK(strstr(e.msg, "context 512") != NULL);
    const char *keys[] = {"ref_ppl", "cand_ppl", "delta_ppl", "kld_mean", "kld_p99", "top1"};
    double vals[] = {10, 10.01, 0.001, 0.0001, 0.001, 0.99};
    for (int ci = 0; ci < 2; ci++) {
        char k[64];
        int n = ci ? 4096 : 512;
        snprintf(k, sizeof k, "ctx.%d.passed", n);
        qf_payload_add_int(&a.cert.config, k, 1, NULL);
        for (int i = 0; i < 6; i++) {
            snprintf(k, sizeof k, "ctx.%d.%s", n, keys[i]);
            qf_payload_add_float(&a.cert.config, k, ci && i == 1 ? NAN : vals[i], NULL);
        }
    }
    CHECK_MSG(qf_artifact_check(&a, NULL, &e) == QF_ERR_ARTIFACT_NOT_CERTIFIED, "%s", e.msg); /* 4096: cand PPL NaN */
    CHECK(strstr(e.msg, "context 4096") != NULL);
    qf_payload_free(&a.cert.config);
    old_cert(&a.cert);
    qf_payload_add_string(&a.cert.config, "certified_ctx", "512,x", NULL);
    CHECK_EQ_INT(qf_artifact_check(&a, NULL, &e), QF_ERR_ARTIFACT_CORRUPT);
    qf_certificate_free(&a.cert);
}

TEST(ctx_list_parse) {
    int v[QF_JOB_MAX_CTX], n = 0;
    qf_error e = {0};
    CHECK(qf_ctx_list_parse("512,4096", v, QF_JOB_MAX_CTX, &n, &e) == QF_OK && n == 2 && v[0] == 512 && v[1] == 4096);
    CHECK(qf_ctx_list_parse("256", v, QF_JOB_MAX_CTX, &n, &e) == QF_OK && n == 1 && v[0] == 256);
    const char *bad[] = {"", ",", "512,", "512,,4096", "abc", "4", "512,512", "1,2,3,4,5,6,7,8,9", "2097152", "-512"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(qf_ctx_list_parse(bad[i], v, QF_JOB_MAX_CTX, &n, &e) == QF_ERR_ARG, "'%s' accepted", bad[i]);
    CHECK(qf_ctx_list_parse("16,32,64,128,256,512,1024,2048", v, QF_JOB_MAX_CTX, &n, &e) == QF_OK && n == 8);
}

int main(void) {
    RUN(gate_defaults_by_rate);
    RUN(gate_judge_each_condition);
    RUN(certificate_gate_old_and_new);
    RUN(certified_ctx_list_and_check);
    RUN(ctx_list_parse);
    return test_summary();
}
