/* certify.c: the certify stage. The reference runs once over the evaluation text and saves
 * its log-probabilities (llama-perplexity's KL-divergence base format, in a temporary file);
 * each candidate is bound to the SAME context (same params, threads, batch and code path),
 * runs the same tokens read back from that file, and is unbound again on every exit path
 * (the one cleanup label below is the C version of the seed's CpuRefPathGuard). Numbers:
 * PPL of both, delta = (cand - ref) / ref, mean and p99 KL(ref || cand), same-top-1. The free
 * baseline at the candidate's rate (q8_0, or q4_0 + hadamard) runs in its own plain-cache
 * context over the same saved tokens, and the verdict is qf_gate_judge (src/format/gate.c),
 * the same predicate the loader applies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qforge/artifact_bind.h"
#include "qforge/forge.h"
#include "qforge/ppl.h"
#include "util/par.h"
#include "util/util.h"

/* the free baselines a reference has measured: [0] q8_0, [1] q4_0 (+ hadamard) */
typedef struct {
    bool done;
    qf_certify_result r;
} baseline_slot;

struct qf_certify_ref {
    char base_path[4096]; /* saved reference log-probs */
    double *chunk_nll;    /* the reference's mean NLL per chunk (rank 0), for the paired ΔPPL error */
    int chunk_nll_cap;
    qf_certify_params p;
    qf_ppl_result r;
    double kv_bytes_per_token;
    baseline_slot base[2];
};

qf_gate qf_gate_default(void) {
    qf_gate g = {0};
    g.max_delta_ppl = QF_GATE_DEFAULT_MAX_DELTA_PPL;
    g.two_sided = g.vs_baseline = g.by_rate = true;
    return g;
}

static qf_gate_numbers numbers_of(const qf_certify_result *r) {
    return (qf_gate_numbers){.ref_ppl = r->ref_ppl, .cand_ppl = r->cand_ppl, .delta_ppl = r->delta_ppl,
                             .kld_mean = r->kld_mean, .kld_p99 = r->kld_p99, .top1 = r->top1,
                             .has_baseline = r->has_baseline, .baseline_kld_mean = r->baseline_kld_mean};
}

bool qf_gate_passes(const qf_gate *g, const qf_certify_result *r) {
    qf_gate_numbers n = numbers_of(r);
    return qf_gate_judge(g, &n, NULL, 0);
}

/* x rounded to d significant digits through the decimal text printf writes (correctly rounded
 * by glibc, so the same double on every machine); d <= 0, NaN and infinities pass unchanged */
static double round_sig(double x, int d) {
    if (d <= 0 || !isfinite(x) || x == 0) return x;
    char buf[64];
    snprintf(buf, sizeof buf, "%.*e", d - 1, x);
    return strtod(buf, NULL);
}

/* the measured numbers of r at d significant digits (qf_certify_params.sig_digits): what the
 * gate judges; r itself keeps the numbers as measured (qforge ppl --artifact reproduces them) */
static void round_result(qf_certify_result *r, int d) {
    double *v[] = {&r->ref_ppl, &r->cand_ppl, &r->delta_ppl, &r->delta_ppl_err, &r->kld_mean, &r->kld_p99, &r->kld_err,
                   &r->top1, &r->baseline_ppl, &r->baseline_delta_ppl, &r->baseline_kld_mean, &r->baseline_kld_p99,
                   &r->baseline_top1};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) *v[i] = round_sig(*v[i], d);
}

/* resolve the gate for (kind, rate), judge r's numbers at `digits` significant digits, and keep
 * the verdict's reason */
static void judge(const qf_gate *gate, qf_artifact_kind kind, qf_certify_result *r, int digits) {
    r->gate = qf_gate_resolve(gate, kind, r->bits_per_element);
    qf_certify_result t = *r;
    round_result(&t, digits);
    qf_gate_numbers n = numbers_of(&t);
    r->passed = qf_gate_judge(&r->gate, &n, r->why, sizeof r->why);
}

static qf_status run_candidate(qf_context *c, const qf_certify_ref *ref, const qf_gate *gate, qf_certify_result *r,
                               qf_error *err);

double qf_certify_ref_ppl(const qf_certify_ref *ref) { return ref ? ref->r.ppl : NAN; }

void qf_certify_ref_free(qf_certify_ref *ref) {
    if (!ref) return;
    if (ref->base_path[0]) qf_temp_remove(ref->base_path);
    free(ref->chunk_nll);
    free(ref);
}

qf_status qf_certify_reference(qf_context *c, const char *eval_text, size_t len, const qf_certify_params *p,
                               qf_certify_ref **out, qf_error *err) {
    qf_error local; /* err is optional (NULL): failures below re-label err->code */
    if (!err) err = &local;
    *out = NULL;
    if (qf_context_bound(c, NULL))
        return qf_fail(err, QF_ERR_ARG, "certify: the reference context must have no artifact bound");
    if (p->n_ctx < 2 || p->n_ctx > qf_context_params_get(c)->n_ctx)
        return qf_fail(err, QF_ERR_ARG, "certify: chunk size %d must be in [2, %d] (the context size)", p->n_ctx,
                       qf_context_params_get(c)->n_ctx);
    qf_certify_ref *ref = calloc(1, sizeof *ref);
    if (!ref) return qf_fail(err, QF_ERR_NOMEM, "certify: out of memory");
    ref->p = *p;
    /* removed on SIGINT/SIGTERM, swept by the next run after a kill -9 (util.h) */
    qf_status tst = qf_temp_create("qforge-certify", ref->base_path, sizeof ref->base_path, err);
    if (tst) {
        qf_error_prefix(err, "certify: reference log-probs: ");
        free(ref);
        return tst;
    }
    qf_ppl_params pp = qf_ppl_default_params();
    pp.n_ctx = p->n_ctx;
    pp.n_chunks = p->n_chunks;
    pp.kl_base_write = ref->base_path;
    pp.kl_base_local = true; /* under mpirun each rank keeps the rows of its own chunks */
    pp.progress = p->progress;
    /* a token is at least one byte (+ BOS): no text has more chunks than this */
    ref->chunk_nll_cap = (int)(len / (size_t)p->n_ctx) + 2;
    if (!(ref->chunk_nll = malloc(sizeof(double) * (size_t)ref->chunk_nll_cap))) {
        qf_certify_ref_free(ref);
        return qf_fail(err, QF_ERR_NOMEM, "certify: out of memory");
    }
    pp.chunk_nll = ref->chunk_nll, pp.chunk_nll_cap = ref->chunk_nll_cap;
    qf_status st = qf_perplexity_text(c, eval_text, len, &pp, &ref->r, err);
    if (st) {
        qf_certify_ref_free(ref);
        qf_error_prefix(err, "certify: reference pass: ");
        if (st != QF_ERR_NOMEM && st != QF_ERR_IO) err->code = st = QF_ERR_CERTIFY_FAILED;
        return st;
    }
    ref->kv_bytes_per_token = qf_context_kv_bytes_per_token(c);
    *out = ref;
    return QF_OK;
}

qf_status qf_certify_candidate(qf_context *c, const qf_certify_ref *ref, qf_artifact_kind kind,
                               const qf_payload *payload, const qf_gate *gate, qf_certify_result *r,
                               qf_error *err) {
    qf_error local; /* err is optional (NULL): failures below re-label err->code */
    if (!err) err = &local;
    memset(r, 0, sizeof *r);
    r->ref_ppl = ref->r.ppl;
    r->cand_ppl = r->delta_ppl = r->kld_mean = r->kld_p99 = r->top1 = NAN;
    r->bits_per_element = r->delta_ppl_err = NAN;
    r->ref_kv_bytes_per_token = ref->kv_bytes_per_token;
    if (qf_context_bound(c, NULL))
        return qf_fail(err, QF_ERR_ARG, "certify: the context already has an artifact bound");

    /* engage: the only thing certification changes on the context is its KV binding (the
     * payload outlives it: it is unbound below on every path) */
    qf_status st = qf_context_bind_payload_in_place(c, kind, payload, err);
    if (st) {
        qf_error_prefix(err, "certify: ");
        if (st != QF_ERR_NOMEM) err->code = st = QF_ERR_CERTIFY_FAILED;
        return st; /* a failed bind leaves the context as it was */
    }
    st = run_candidate(c, ref, gate, r, err);
    /* restore on every path; an unbind failure outranks the result */
    qf_error uerr = {0};
    if (qf_context_unbind(c, &uerr)) {
        *err = uerr;
        return qf_error_prefix(err, "certify: restoring the context's KV mode: ");
    }
    if (st) return st;
    /* the rate, the free baseline at that rate on the same tokens, then the verdict */
    r->bits_per_element = qf_artifact_bits_per_element(kind, payload, qf_model_hparams(qf_context_model(c)), ref->p.n_ctx);
    if ((st = qf_certify_baseline(c, ref, r->bits_per_element, r, err))) return st;
    judge(gate, kind, r, ref->p.sig_digits);
    return QF_OK;
}

qf_status qf_certify_baseline(qf_context *c, const qf_certify_ref *cref, double bits, qf_certify_result *r,
                              qf_error *err) {
    qf_error local;
    if (!err) err = &local;
    qf_certify_ref *ref = (qf_certify_ref *)cref; /* the baseline cache is the only thing written */
    const qf_hparams *hp = qf_model_hparams(qf_context_model(c));
    bool q4 = !(bits > 6.0); /* NaN (unknown rate): the cheaper, stricter-to-beat-per-bit q4_0 */
    bool rot = q4 && (hp->head_dim & (hp->head_dim - 1)) == 0;
    baseline_slot *b = &ref->base[q4];
    if (!b->done) {
        qf_context_params cp = *qf_context_params_get(c);
        cp.kv_k = cp.kv_v = q4 ? QF_KV_Q4_0 : QF_KV_Q8_0;
        cp.kv_rot = rot ? QF_KV_ROT_HADAMARD : QF_KV_ROT_NONE;
        cp.device = qf_context_device(c); /* where this certification runs (the GPU for kv-int8 --device cuda) */
        qf_context *bc = qf_context_new(qf_context_model(c), &cp, err);
        if (!bc) return qf_error_prefix(err, "certify: the free baseline's context: ");
        memset(&b->r, 0, sizeof b->r);
        qf_status st = run_candidate(bc, ref, NULL, &b->r, err);
        qf_context_free(bc);
        if (st) return qf_error_prefix(err, "(free baseline %s) ", q4 ? "q4_0" : "q8_0");
        b->done = true;
    }
    r->has_baseline = true;
    snprintf(r->baseline, sizeof r->baseline, "%s", q4 ? (rot ? "q4_0+hadamard" : "q4_0") : "q8_0");
    r->baseline_bits = q4 ? 4.5 : 8.5;
    r->baseline_ppl = b->r.cand_ppl;
    r->baseline_delta_ppl = b->r.delta_ppl;
    r->baseline_kld_mean = b->r.kld_mean;
    r->baseline_kld_p99 = b->r.kld_p99;
    r->baseline_top1 = b->r.top1;
    return QF_OK;
}

qf_status qf_certify_context(qf_context *cand, const qf_certify_ref *ref, const qf_gate *gate, qf_certify_result *r,
                             qf_error *err) {
    qf_error local; /* err is optional (NULL): failures below re-label err->code */
    if (!err) err = &local;
    memset(r, 0, sizeof *r);
    r->ref_ppl = ref->r.ppl;
    r->cand_ppl = r->delta_ppl = r->kld_mean = r->kld_p99 = r->top1 = NAN;
    r->ref_kv_bytes_per_token = ref->kv_bytes_per_token;
    r->bits_per_element = NAN; /* a whole other model (awq): no KV rate, no KV baseline */
    qf_status st = run_candidate(cand, ref, gate, r, err);
    if (!st) judge(gate, QF_ARTIFACT_AWQ, r, ref->p.sig_digits);
    return st;
}

/* the candidate pass: the reference's tokens and chunking, read back from its base file */
static qf_status run_candidate(qf_context *c, const qf_certify_ref *ref, const qf_gate *gate, qf_certify_result *r,
                               qf_error *err) {
    qf_status st;
    r->cand_kv_bytes_per_token = qf_context_kv_bytes_per_token(c);
    qf_ppl_params pp = qf_ppl_default_params();
    pp.n_ctx = ref->p.n_ctx;
    pp.n_chunks = ref->p.n_chunks;
    pp.kl_base_read = ref->base_path;
    pp.kl_base_local = true;
    pp.progress = ref->p.progress;
    qf_ppl_result pr;
    int nc = ref->r.n_chunks;
    double *cn = nc > 0 && nc <= ref->chunk_nll_cap ? malloc(sizeof(double) * (size_t)nc) : NULL;
    if (nc > 0 && !cn) return qf_fail(err, QF_ERR_NOMEM, "certify: out of memory");
    pp.chunk_nll = cn, pp.chunk_nll_cap = cn ? nc : 0;
    double t0 = qf_now_sec();
    st = qf_perplexity(c, NULL, 0, &pp, &pr, err);
    r->seconds = qf_now_sec() - t0;
    /* the paired per-chunk standard error of ΔPPL from the exact NLLs of both passes (the base
     * file floors log-probs; these do not): rank 0 has them, every rank gets the number */
    if (!st && cn) {
        double s1 = 0, s2 = 0;
        if (qf_mpi_rank() == 0)
            for (int i = 0; i < nc; i++) {
                double d = cn[i] - ref->chunk_nll[i];
                s1 += d, s2 += d * d;
            }
        double md = s1 / nc, var = nc > 1 ? (s2 - nc * md * md) / (nc - 1) : 0;
        r->delta_ppl_err = var > 0 ? exp(md) * sqrt(var / nc) : 0;
        st = qf_par_bcast(&r->delta_ppl_err, sizeof r->delta_ppl_err, 0, err);
    }
    free(cn);
    if (st) {
        qf_error_prefix(err, "certify: candidate pass: ");
        if (st != QF_ERR_NOMEM) err->code = st = QF_ERR_CERTIFY_FAILED;
        return st;
    }
    r->cand_ppl = pr.ppl;
    r->delta_ppl = (pr.ppl - ref->r.ppl) / ref->r.ppl;
    r->kld_mean = pr.kld_mean;
    r->kld_p99 = pr.kld_p99;
    r->kld_err = pr.kld_err;
    r->top1 = pr.same_top_p;
    r->n_ctx = pp.n_ctx;
    r->n_chunks = pr.n_chunks;
    r->n_scored = pr.n_scored;
    r->eval_tokens = (int64_t)pr.n_chunks * pp.n_ctx;
    (void)gate; /* judged by the caller, once the rate and the baseline are known */
    return QF_OK;
}
