/* gate.c: the certification gate, one predicate for the certifier and the loader.
 *
 * Before issue 15 the gate lived twice (certify.c required a finite PPL, artifact.c did not)
 * and gated on ΔPPL alone, which rewards noise: a calibrated cache whose PPL lands below the
 * reference's passed with nine times the KL divergence of plain q8_0. Now both sides call
 * qf_gate_judge, which gates on |ΔPPL|, mean and p99 KLD (thresholds by rate) and on the free
 * baseline at the same rate measured on the same tokens. */
#include <math.h>
#include <stdio.h>

#include "qforge/artifact.h"

qf_gate qf_gate_default_for(qf_artifact_kind kind, double bits) {
    qf_gate g = {0};
    g.max_delta_ppl = 0.05;
    g.two_sided = true;
    if (kind == QF_ARTIFACT_AWQ) return g; /* weights: ΔPPL (and its RTN baseline, reported) */
    g.vs_baseline = true;
    g.has_max_kld = g.has_max_kld_p99 = true;
    if (bits >= 6.0) g.max_kld = 0.002, g.max_kld_p99 = 0.02;
    else if (bits >= 3.5) g.max_kld = 0.02, g.max_kld_p99 = 0.2;
    else g.max_kld = 0.05, g.max_kld_p99 = 0.5; /* NaN bits land here: the strictest is not needed */
    return g;
}

qf_gate qf_gate_resolve(const qf_gate *g, qf_artifact_kind kind, double bits) {
    qf_gate r = *g;
    if (!g->by_rate) return r;
    qf_gate d = qf_gate_default_for(kind, bits);
    if (!r.has_max_kld) r.has_max_kld = d.has_max_kld, r.max_kld = d.max_kld;
    if (!r.has_max_kld_p99) r.has_max_kld_p99 = d.has_max_kld_p99, r.max_kld_p99 = d.max_kld_p99;
    if (kind == QF_ARTIFACT_AWQ) r.vs_baseline = false;
    r.by_rate = false;
    return r;
}

#define FAIL(...) return (why ? (void)snprintf(why, cap, __VA_ARGS__) : (void)0), false

bool qf_gate_judge(const qf_gate *g, const qf_gate_numbers *n, char *why, size_t cap) {
    if (why && cap) why[0] = 0;
    /* every comparison is written so that a NaN fails it */
    if (!isfinite(n->ref_ppl) || !isfinite(n->cand_ppl))
        FAIL("PPL not finite (reference %g, candidate %g)", n->ref_ppl, n->cand_ppl);
    double d = g->two_sided ? fabs(n->delta_ppl) : n->delta_ppl;
    if (!(d <= g->max_delta_ppl))
        FAIL("%sdelta PPL%s %+.4f%% exceeds %.4f%%", g->two_sided ? "|" : "", g->two_sided ? "|" : "", 100 * n->delta_ppl,
             100 * g->max_delta_ppl);
    if (g->has_max_kld && !(n->kld_mean <= g->max_kld))
        FAIL("mean KLD %.6g exceeds %.6g", n->kld_mean, g->max_kld);
    if (g->has_max_kld_p99 && !(n->kld_p99 <= g->max_kld_p99))
        FAIL("p99 KLD %.6g exceeds %.6g", n->kld_p99, g->max_kld_p99);
    if (g->has_min_top1 && !(n->top1 >= g->min_top1))
        FAIL("same-top-1 %.4f%% below %.4f%%", 100 * n->top1, 100 * g->min_top1);
    if (g->vs_baseline) {
        if (!n->has_baseline) FAIL("the free baseline at this rate was not measured");
        if (!(n->kld_mean <= n->baseline_kld_mean))
            FAIL("mean KLD %.6g is worse than the free baseline's %.6g at the same rate "
                 "(--allow-worse-than-baseline to accept it)",
                 n->kld_mean, n->baseline_kld_mean);
    }
    return true;
}

/* ---- the certificate's side ----
 * The numbers added with issue 15 live in the certificate's config map under reserved keys
 * (docs/artifact-format.md "Gate and context keys"), so the container stays version 1: an
 * older artifact has none of them and is judged exactly as before (one-sided ΔPPL, its own
 * KLD / top-1 thresholds), now with finite PPLs required as certification always did. */

void qf_certificate_gate(const qf_certificate *c, qf_gate *g, qf_gate_numbers *n) {
    const qf_payload *cf = &c->config;
    int64_t v = 0;
    double x = 0;
    *g = (qf_gate){0};
    g->max_delta_ppl = c->gate_max_delta_ppl;
    g->has_max_kld = c->gate_has_max_kld, g->max_kld = c->gate_max_kld;
    g->has_min_top1 = c->gate_has_min_top1, g->min_top1 = c->gate_min_top1;
    if (qf_payload_get_float(cf, "gate.max_kld_p99", &x)) g->has_max_kld_p99 = true, g->max_kld_p99 = x;
    g->two_sided = qf_payload_get_int(cf, "gate.two_sided", &v) && v != 0;
    g->vs_baseline = qf_payload_get_int(cf, "gate.vs_baseline", &v) && v != 0;
    *n = (qf_gate_numbers){.ref_ppl = c->ref_ppl, .cand_ppl = c->cand_ppl, .delta_ppl = c->delta_ppl,
                           .kld_mean = c->kld_mean, .kld_p99 = c->kld_p99, .top1 = c->top1_agreement};
    if (qf_payload_get_float(cf, "baseline.kld_mean", &x)) n->has_baseline = true, n->baseline_kld_mean = x;
}

bool qf_certificate_ctx_numbers(const qf_certificate *c, int n_ctx, qf_gate_numbers *n, bool *passed) {
    const qf_payload *cf = &c->config;
    char k[64];
    int64_t p = 0;
    double x = 0;
    *n = (qf_gate_numbers){0};
#define GETF(name, dst) (snprintf(k, sizeof k, "ctx.%d." name, n_ctx), qf_payload_get_float(cf, k, &(dst)))
    snprintf(k, sizeof k, "ctx.%d.passed", n_ctx);
    if (!qf_payload_get_int(cf, k, &p)) return false;
    if (!GETF("ref_ppl", n->ref_ppl) || !GETF("cand_ppl", n->cand_ppl) || !GETF("delta_ppl", n->delta_ppl) ||
        !GETF("kld_mean", n->kld_mean) || !GETF("kld_p99", n->kld_p99) || !GETF("top1", n->top1))
        return false;
    if (GETF("baseline_kld_mean", x)) n->has_baseline = true, n->baseline_kld_mean = x;
#undef GETF
    if (passed) *passed = p != 0;
    return true;
}

int qf_certificate_certified_ctx(const qf_certificate *c, int *out, int max) {
    const char *s = qf_payload_get_string(&c->config, "certified_ctx");
    int n = 0;
    if (!s) { /* before --ctx lists: the one context it was evaluated at */
        int64_t v = 0;
        if (qf_payload_get_int(&c->config, "eval_n_ctx", &v) && v > 0 && v <= (1 << 20) && max > 0) out[n++] = (int)v;
        return n;
    }
    while (*s && n < max) {
        long v = 0;
        int digits = 0;
        while (*s >= '0' && *s <= '9' && v <= (1 << 20)) v = v * 10 + (*s++ - '0'), digits++;
        if (!digits || v < 2 || v > (1 << 20) || (*s && *s != ',')) return -1;
        out[n++] = (int)v;
        if (*s == ',') s++;
    }
    return n;
}

int qf_artifact_max_certified_ctx(const qf_artifact *a) {
    int ctx[16];
    int n = qf_certificate_certified_ctx(&a->cert, ctx, 16), mx = 0;
    for (int i = 0; i < n; i++)
        if (ctx[i] > mx) mx = ctx[i];
    return mx;
}

qf_status qf_artifact_check_ctx(const qf_artifact *a, int n_ctx, bool force, bool *forced, qf_error *err) {
    if (forced) *forced = false;
    if (a->cert.kind == QF_ARTIFACT_AWQ) return QF_OK; /* a weight artifact: no KV context to certify */
    int mx = qf_artifact_max_certified_ctx(a);
    if (mx <= 0 || n_ctx <= mx) return QF_OK; /* unknown (hand-made certificate): nothing to compare */
    if (force) {
        if (forced) *forced = true;
        return QF_OK;
    }
    return qf_fail(err, QF_ERR_ARTIFACT_NOT_CERTIFIED,
                   "context %d is larger than the largest context this artifact is certified at (%d): KV error grows "
                   "with context; run with -c %d or less, certify at %d (qforge calibrate --ctx ...,%d), or pass "
                   "--force-uncertified-ctx to run uncertified",
                   n_ctx, mx, mx, n_ctx, n_ctx);
}
