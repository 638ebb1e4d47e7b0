/* analyze.c: `qforge analyze`, every KV-cache method judged on the end metric (see
 * include/qforge/analyze.h). One corpus split, one capture of the calibration split for the
 * learners, one f32-KV reference pass over the evaluation split, then one real perplexity pass
 * per method and rate through the certifier (qf_certify_context for plain cache types in a
 * context of their own, qf_certify_candidate for learned payloads bound to the reference
 * context), so every number here is the number certification would see. Then the Pareto
 * frontier over (bits per element, mean KLD) and a verdict per method.
 *
 * Adding a method is one row in METHODS: a plain cache type (mode + rotation), or a learned
 * artifact kind with a rate count and a function that writes rate i's settings into the qf_job
 * its learner reads (qf_job_learn). */
#include "qforge/analyze.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plot.h"
#include "qforge/artifact_bind.h"
#include "qforge/capture.h"
#include "qforge/corpus.h"
#include "util/util.h"

/* ---- the method table ---- */

typedef struct {
    const char *name;
    /* plain cache types: kv (both streams) and the rotation */
    qf_kv_mode kv;
    qf_kv_rot rot;
    /* learned artifacts: the kind, how many rates the params ask for, and rate i's settings
     * (the qf_job fields its learner reads, and the learner's variant) */
    bool learned;
    qf_artifact_kind kind;
    int (*n_rates)(const qf_analyze_params *p);
    void (*rate)(const qf_analyze_params *p, int i, qf_job *j, int *variant);
    /* learned by the whole calibrate job (qf_job_run: a learner that searches its allocation by
     * certifying candidates), then measured here like any payload; a rate whose job cannot
     * certify anything within its budget is a skip */
    bool via_job;
} method;

static int int8_rates(const qf_analyze_params *p) {
    (void)p;
    return qf_job_learn_variants(QF_ARTIFACT_KV_INT8); /* every layout calibrate tries */
}
static void int8_rate(const qf_analyze_params *p, int i, qf_job *j, int *variant) {
    (void)p, (void)j;
    *variant = i;
}
static int dict_rates(const qf_analyze_params *p) { return p->n_dict; }
static void dict_rate(const qf_analyze_params *p, int i, qf_job *j, int *variant) {
    j->dict_atoms = p->dict[i].n_atoms;
    j->dict_sparsity = p->dict[i].sparsity;
    j->dict_iters = p->dict_iters;
    j->dict_coef = p->dict_coef;
    *variant = 0;
}
/* kv-rq: one point per budget (--rq-bits); the whole calibrate job runs, because the learner
 * certifies its own bit allocation within the budget */
static int rq_rates(const qf_analyze_params *p) { return p->n_rq_bits; }
static void rq_rate(const qf_analyze_params *p, int i, qf_job *j, int *variant) {
    j->rq_bits = p->rq_bits[i];
    *variant = 0;
}

static const method METHODS[] = {
    {"f16", .kv = QF_KV_F16},
    {"q8_0", .kv = QF_KV_Q8_0},
    {"q4_0", .kv = QF_KV_Q4_0},
    {"q8_0+hadamard", .kv = QF_KV_Q8_0, .rot = QF_KV_ROT_HADAMARD},
    {"q4_0+hadamard", .kv = QF_KV_Q4_0, .rot = QF_KV_ROT_HADAMARD},
    {"kv-int8", .learned = true, .kind = QF_ARTIFACT_KV_INT8, .n_rates = int8_rates, .rate = int8_rate},
    {"kv-dict", .learned = true, .kind = QF_ARTIFACT_KV_DICT, .n_rates = dict_rates, .rate = dict_rate},
    {"kv-rq", .learned = true, .kind = QF_ARTIFACT_KV_RQ, .n_rates = rq_rates, .rate = rq_rate, .via_job = true},
};
#define N_METHODS ((int)(sizeof METHODS / sizeof METHODS[0]))

const char *qf_analyze_method_name(int i) { return i >= 0 && i < N_METHODS ? METHODS[i].name : NULL; }
bool qf_analyze_method_learned(int i) { return i >= 0 && i < N_METHODS && METHODS[i].learned; }

void qf_analyze_params_default(qf_analyze_params *p) {
    memset(p, 0, sizeof *p);
    p->n_ctx = 512;
    p->eval_chunks = 12;
    p->max_calib_tokens = 8192;
    p->capture_per_layer = 4096;
    p->capture_device = QF_DEVICE_AUTO;
    p->cross_check = true;
    p->dict[0] = (qf_dict_config){256, 4};
    p->dict[1] = (qf_dict_config){256, 8};
    p->dict[2] = (qf_dict_config){256, 16};
    p->n_dict = 3;
    p->dict_iters = 10;
    p->dict_coef = QF_KV_COEF_F16;
    p->rq_bits[0] = 3, p->rq_bits[1] = 4;
    p->n_rq_bits = 2;
    p->seed = 1;
}

void qf_analyze_report_free(qf_analyze_report *rep) {
    if (!rep) return;
    free(rep->points);
    free(rep->frontier);
    free(rep->verdicts);
    free(rep->skipped);
    memset(rep, 0, sizeof *rep);
}

static void logf_(const qf_analyze_params *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(const qf_analyze_params *p, const char *fmt, ...) {
    if (!p->log) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("analyze: ", p->log);
    vfprintf(p->log, fmt, ap);
    fputc('\n', p->log);
    fflush(p->log);
    va_end(ap);
}

/* Which methods the params ask for: want[i] per METHODS row. */
static qf_status parse_methods(const char *s, bool want[N_METHODS], qf_error *err) {
    if (!s || !*s || !strcmp(s, "all")) {
        for (int i = 0; i < N_METHODS; i++) want[i] = true;
        return QF_OK;
    }
    for (int i = 0; i < N_METHODS; i++) want[i] = false;
    const char *q = s;
    while (*q) {
        size_t n = strcspn(q, ",");
        int found = -1;
        for (int i = 0; i < N_METHODS; i++)
            if (strlen(METHODS[i].name) == n && !strncmp(q, METHODS[i].name, n)) found = i;
        if (found < 0) {
            char names[256] = "";
            for (int i = 0; i < N_METHODS; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", METHODS[i].name);
            return qf_fail(err, QF_ERR_ARG, "analyze: unknown method '%.*s' (known: %s)", (int)n, q, names);
        }
        want[found] = true;
        q += n;
        if (*q == ',') q++;
    }
    return QF_OK;
}

static qf_status add_skip(qf_analyze_report *rep, int *cap, const char *m, const char *label, const char *why,
                          qf_error *err) {
    if (rep->n_skipped == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        qf_analyze_skip *ns = realloc(rep->skipped, (size_t)nc * sizeof *ns);
        if (!ns) return qf_fail(err, QF_ERR_NOMEM, "analyze: out of memory");
        rep->skipped = ns;
        *cap = nc;
    }
    qf_analyze_skip *s = &rep->skipped[rep->n_skipped++];
    snprintf(s->method, sizeof s->method, "%s", m);
    snprintf(s->label, sizeof s->label, "%s", label);
    snprintf(s->reason, sizeof s->reason, "%s", why);
    return QF_OK;
}

/* ---- the run ---- */

typedef struct {
    qf_corpus *corpus;
    qf_model *model;
    qf_context *ctx; /* the reference context: CPU, f32 KV; learned payloads are bound to it */
    qf_capture *cap;
    qf_certify_ref *ref;
} state;

static void state_free(state *s) {
    qf_certify_ref_free(s->ref);
    qf_capture_free(s->cap);
    qf_context_free(s->ctx);
    qf_model_free(s->model);
    qf_corpus_free(s->corpus);
}

static qf_status stage_corpus(const qf_analyze_params *p, state *s, qf_analyze_report *rep, qf_error *err) {
    if (!(s->corpus = qf_corpus_new())) return qf_fail(err, QF_ERR_NOMEM, "corpus: out of memory");
    qf_status st = QF_OK;
    for (int i = 0; i < p->n_corpus_paths && !st; i++) st = qf_corpus_add_path(s->corpus, p->corpus_paths[i], err);
    if (!st && (p->builtin || p->n_corpus_paths == 0)) st = qf_corpus_add_builtin(s->corpus, err);
    if (!st) st = qf_corpus_finalize(s->corpus, p->eval_frac > 0 ? p->eval_frac : QF_CORPUS_DEFAULT_EVAL_FRAC, err);
    if (st) return st;
    const qf_corpus_info *info = qf_corpus_get_info(s->corpus);
    rep->calib_docs = info->n_calib_docs;
    rep->eval_docs = info->n_eval_docs;
    if (info->n_calib_docs == 0 || info->n_eval_docs == 0)
        return qf_fail(err, QF_ERR_CORPUS_EMPTY,
                       "corpus: %zu document(s): the analysis needs at least one calibration and one evaluation "
                       "document (disjoint); add text",
                       info->n_docs);
    logf_(p, "corpus: %zu documents (%zu calibration, %zu evaluation)", info->n_docs, info->n_calib_docs,
          info->n_eval_docs);
    return QF_OK;
}

/* Capture the calibration split for the learners (the GPU read-back route when asked for or
 * found), and optionally the first window on the scalar reference route vs the fast route. */
static qf_status stage_capture(const qf_analyze_params *p, state *s, qf_analyze_report *rep, qf_error *err) {
    double t0 = qf_now_sec();
    const qf_hparams *hp = qf_model_hparams(s->model);
    const qf_tokenizer *tok = qf_model_tokenizer(s->model);
    size_t clen, n = 0;
    const char *ctext = qf_corpus_calib_text(s->corpus, &clen);
    int32_t *ids = NULL;
    qf_context *gpu = NULL, *xr = NULL, *xf = NULL;
    qf_capture *cr = NULL, *cf = NULL;
    qf_status st = qf_tokenize(tok, ctext, clen, qf_tokenizer_add_bos(tok), false, &ids, &n, err);
    if (st) return st;
    qf_capture_params cp = {.max_per_layer = p->capture_per_layer, .activations = false, .seed = p->seed};
    if (!(s->cap = qf_capture_new(hp, &cp, err))) {
        st = err ? err->code : QF_ERR_NOMEM;
        goto done;
    }
    const qf_context_params *rp = qf_context_params_get(s->ctx);
    if (p->capture_device == QF_DEVICE_CUDA || (p->capture_device == QF_DEVICE_AUTO && qf_cuda_available())) {
        qf_context_params gp = *rp;
        gp.device = QF_DEVICE_CUDA;
        if (!(gpu = qf_context_new(s->model, &gp, err))) {
            st = err ? err->code : QF_ERR_DEVICE;
            goto done;
        }
    }
    snprintf(rep->capture_device, sizeof rep->capture_device, "%s", gpu ? "cuda" : "cpu");
    st = qf_capture_run(gpu ? gpu : s->ctx, s->cap, ids, (int64_t)n, rp->n_ctx, p->max_calib_tokens, p->progress, err);
    if (st) goto done;
    rep->calib_tokens = qf_capture_tokens_seen(s->cap);
    if (p->cross_check) {
        /* the same first window through the scalar reference route and the fast route */
        int w = rp->n_ctx < 128 ? rp->n_ctx : 128;
        qf_context_params a = *rp, b = *rp;
        a.reference = true;
        a.n_ctx = a.n_batch = b.n_ctx = b.n_batch = w;
        if (gpu) b.device = QF_DEVICE_CUDA;
        qf_capture_params xp = {.max_per_layer = (int64_t)w * hp->n_head_kv, .seed = 1};
        if (!(xr = qf_context_new(s->model, &a, err)) || !(xf = qf_context_new(s->model, &b, err)) ||
            !(cr = qf_capture_new(hp, &xp, err)) || !(cf = qf_capture_new(hp, &xp, err))) {
            st = err ? err->code : QF_ERR_NOMEM;
            goto done;
        }
        if ((st = qf_capture_run(xr, cr, ids, (int64_t)n, w, w, false, err)) ||
            (st = qf_capture_run(xf, cf, ids, (int64_t)n, w, w, false, err)))
            goto done;
        rep->cross_check_tokens = w;
        rep->cross_check_max_rel_diff = qf_capture_max_rel_diff(cr, cf);
    }
    rep->seconds_capture = qf_now_sec() - t0;
    logf_(p, "capture: %lld calibration tokens on the %s in %.1f s", (long long)rep->calib_tokens,
          gpu ? "GPU (read back)" : "CPU", rep->seconds_capture);
done:
    if (st) {
        qf_error_prefix(err, "capture: ");
        if (st != QF_ERR_NOMEM) err->code = st = QF_ERR_CAPTURE_FAILED;
    }
    qf_capture_free(cr);
    qf_capture_free(cf);
    qf_context_free(xr);
    qf_context_free(xf);
    qf_context_free(gpu);
    free(ids);
    return st;
}

/* One measured point from the certifier's numbers. */
static void fill_point(qf_analyze_point *pt, const qf_analyze_report *rep, const char *m, const char *label,
                       const qf_certify_result *r, double table_bytes, double seconds) {
    memset(pt, 0, sizeof *pt);
    snprintf(pt->method, sizeof pt->method, "%s", m);
    snprintf(pt->label, sizeof pt->label, "%s", label);
    double elems = (double)rep->n_layer * rep->n_head_kv * rep->head_dim * 2.0;
    pt->kv_bytes_per_token = r->cand_kv_bytes_per_token;
    /* a learned payload's rate is the artifact's own (qf_artifact_bits_per_element, what verify
     * reports: sink/window rows amortised at n_ctx); a plain cache's is what it stores */
    pt->bits_per_element = isfinite(r->bits_per_element) ? r->bits_per_element
                                                         : r->cand_kv_bytes_per_token * 8.0 / elems;
    pt->table_bytes = table_bytes;
    pt->bits_per_element_with_tables = pt->bits_per_element + table_bytes * 8.0 / (elems * rep->n_ctx);
    pt->ppl = r->cand_ppl;
    pt->delta_ppl = r->delta_ppl;
    pt->kld_mean = r->kld_mean;
    pt->kld_err = r->kld_err;
    pt->kld_p99 = r->kld_p99;
    pt->top1 = r->top1;
    pt->passes_gate = r->passed;
    if (!isfinite(r->bits_per_element)) {
        /* a plain cache: the KV thresholds for its rate (no baseline: it is one) */
        qf_gate g = qf_gate_default_for(QF_ARTIFACT_KV_INT8, pt->bits_per_element);
        g.vs_baseline = false;
        qf_gate_numbers n = {.ref_ppl = r->ref_ppl, .cand_ppl = r->cand_ppl, .delta_ppl = r->delta_ppl,
                             .kld_mean = r->kld_mean, .kld_p99 = r->kld_p99, .top1 = r->top1};
        pt->passes_gate = qf_gate_judge(&g, &n, NULL, 0);
    }
    pt->seconds = seconds;
    pt->dominated_by = -1;
}

/* A learned method through the whole calibrate job: corpus, capture, learn, certify, package
 * to a temporary .qfa, whose payload is returned (*out empty on failure). */
static qf_status learn_via_job(const qf_analyze_params *p, state *s, qf_job *j, qf_payload *out, char *label,
                               size_t label_cap, qf_error *err) {
    const char *tmp = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/qforge-analyze-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return qf_fail(err, QF_ERR_IO, "analyze: cannot create a temporary file in %s", tmp && *tmp ? tmp : "/tmp");
    close(fd);
    j->model_path = p->model_path;
    j->corpus_paths = p->corpus_paths;
    j->n_corpus_paths = p->n_corpus_paths;
    j->builtin = p->builtin || p->n_corpus_paths == 0;
    j->eval_frac = p->eval_frac;
    j->n_ctx = qf_context_params_get(s->ctx)->n_ctx;
    j->max_calib_tokens = p->max_calib_tokens;
    j->eval_chunks = p->eval_chunks < 0 ? -1 : p->eval_chunks;
    j->n_threads = p->n_threads;
    j->capture_per_layer = p->capture_per_layer;
    j->capture_device = p->capture_device;
    memset(&j->gate, 0, sizeof j->gate); /* the analysis judges; the job only has to package its best */
    j->gate.max_delta_ppl = 1e9;
    j->out_path = path;
    qf_job_report rep;
    qf_status st = qf_job_run(j, &rep, err);
    if (!st) snprintf(label, label_cap, "%s", rep.variant);
    qf_job_report_free(&rep);
    qf_artifact a;
    memset(&a, 0, sizeof a);
    if (!st && !(st = qf_artifact_load(path, qf_model_sha256(s->model), NULL, &a, err))) {
        *out = a.payload; /* moved out of the artifact */
        memset(&a.payload, 0, sizeof a.payload);
    }
    qf_artifact_free(&a);
    unlink(path);
    return st;
}

/* Measure every rate of METHODS[mi]; a point that cannot be measured is a skip (resource
 * errors abort). */
static qf_status measure_method(const qf_analyze_params *p, state *s, int mi, qf_analyze_report *rep, int *skip_cap,
                                qf_error *err) {
    const method *m = &METHODS[mi];
    qf_gate gate = qf_gate_default();
    int n_rates = m->learned ? m->n_rates(p) : 1;
    for (int i = 0; i < n_rates; i++) {
        qf_error e = {0};
        qf_certify_result r;
        char label[32];
        double table = 0, t0 = qf_now_sec();
        qf_status st;
        if (!m->learned) {
            snprintf(label, sizeof label, "%s", m->name); /* one rate: the label is the method */
            qf_context_params cp = *qf_context_params_get(s->ctx);
            cp.kv_k = cp.kv_v = m->kv;
            cp.kv_rot = m->rot;
            qf_context *c = qf_context_new(s->model, &cp, &e);
            st = c ? qf_certify_context(c, s->ref, &gate, &r, &e) : (e.code ? e.code : QF_ERR_NOMEM);
            qf_context_free(c);
        } else {
            qf_job j;
            qf_job_default(&j);
            j.kind = m->kind;
            j.seed = p->seed;
            int variant = 0;
            m->rate(p, i, &j, &variant);
            snprintf(label, sizeof label, "rate %d", i);
            qf_payload pl = {0};
            st = m->via_job ? learn_via_job(p, s, &j, &pl, label, sizeof label, &e)
                            : qf_job_learn(&j, s->ctx, s->cap, variant, &pl, label, sizeof label, &e);
            if (!st) st = qf_certify_candidate(s->ctx, s->ref, m->kind, &pl, &gate, &r, &e);
            table = qf_artifact_table_bytes(m->kind, &pl);
            qf_payload_free(&pl);
        }
        if (st == QF_ERR_NOMEM) {
            if (err) *err = e;
            return st;
        }
        if (st) {
            logf_(p, "%s %s: not measured: %s: %s", m->name, label, qf_status_name(st), e.msg);
            if ((st = add_skip(rep, skip_cap, m->name, label, e.msg, err))) return st;
            continue;
        }
        if (rep->n_chunks == 0) { /* the chunking is the reference's, the same for every point */
            rep->n_chunks = r.n_chunks;
            rep->n_scored = r.n_scored;
            rep->eval_tokens = r.eval_tokens;
        }
        qf_analyze_point *pt = &rep->points[rep->n_points++];
        fill_point(pt, rep, m->name, label, &r, table, qf_now_sec() - t0);
        logf_(p, "%-14s %-12s %6.3f b/elem: PPL %.4f (%+.3f%%), KLD mean %.3e p99 %.3e, top-1 %.2f%% (%.1f s)", m->name,
              label, pt->bits_per_element, pt->ppl, 100 * pt->delta_ppl, pt->kld_mean, pt->kld_p99, 100 * pt->top1,
              pt->seconds);
    }
    return QF_OK;
}

qf_status qf_analyze_run(const qf_analyze_params *p, qf_analyze_report *rep, qf_error *err) {
    memset(rep, 0, sizeof *rep);
    double t0 = qf_now_sec();
    bool want[N_METHODS];
    qf_status st;
    if (!p->model_path) return qf_fail(err, QF_ERR_ARG, "analyze: no model given");
    if (p->n_ctx < 8) return qf_fail(err, QF_ERR_ARG, "analyze: context %d: expected at least 8 tokens", p->n_ctx);
    if (p->n_dict < 0 || p->n_dict > QF_ANALYZE_MAX_RATES || p->n_rq_bits < 0 || p->n_rq_bits > QF_ANALYZE_MAX_RATES)
        return qf_fail(err, QF_ERR_ARG, "analyze: at most %d rates per method", QF_ANALYZE_MAX_RATES);
    for (int i = 0; i < p->n_dict; i++)
        if (p->dict[i].n_atoms < 1 || p->dict[i].n_atoms > QF_KV_MAX_ATOMS || p->dict[i].sparsity < 1 ||
            p->dict[i].sparsity > p->dict[i].n_atoms)
            return qf_fail(err, QF_ERR_ARG, "analyze: kv-dict %dx%d: atoms must be in [1, %d], sparsity in [1, atoms]",
                           p->dict[i].n_atoms, p->dict[i].sparsity, QF_KV_MAX_ATOMS);
    if ((st = parse_methods(p->methods, want, err))) return st;
    rep->tables_in_rate = p->tables_in_rate;
    rep->ref_bits_per_element = 32;
    state s = {0};
    int skip_cap = 0;
    const char *asked[N_METHODS];
    int n_asked = 0, n_cap = 0;
    bool any_learned = false;
    for (int i = 0; i < N_METHODS; i++)
        if (want[i]) {
            asked[n_asked++] = METHODS[i].name;
            n_cap += METHODS[i].learned ? METHODS[i].n_rates(p) : 1;
            any_learned |= METHODS[i].learned && METHODS[i].n_rates(p) > 0;
        }
    if (!(rep->points = calloc((size_t)(n_cap > 0 ? n_cap : 1), sizeof *rep->points))) {
        st = qf_fail(err, QF_ERR_NOMEM, "analyze: out of memory");
        goto done;
    }
    if ((st = stage_corpus(p, &s, rep, err))) goto done;
    if (!(s.model = qf_model_load(p->model_path, err))) {
        st = err ? err->code : QF_ERR_IO;
        goto done;
    }
    const qf_hparams *hp = qf_model_hparams(s.model);
    rep->n_layer = hp->n_layer;
    rep->n_head_kv = hp->n_head_kv;
    rep->head_dim = hp->head_dim;
    rep->n_ctx = p->n_ctx > hp->n_ctx_train && hp->n_ctx_train > 0 ? hp->n_ctx_train : p->n_ctx;
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = cp.n_batch = rep->n_ctx;
    cp.n_threads = p->n_threads;
    cp.kv_k = cp.kv_v = QF_KV_F32;
    cp.device = QF_DEVICE_CPU; /* the learned KV modes live on the CPU path; every point runs there */
    if (!(s.ctx = qf_context_new(s.model, &cp, err))) {
        st = err ? err->code : QF_ERR_NOMEM;
        goto done;
    }
    if (any_learned && (st = stage_capture(p, &s, rep, err))) goto done;
    double tr = qf_now_sec();
    size_t elen;
    const char *etext = qf_corpus_eval_text(s.corpus, &elen);
    qf_certify_params cpp = {.n_ctx = rep->n_ctx, .n_chunks = p->eval_chunks < 0 ? 0 : p->eval_chunks,
                             .progress = p->progress};
    if ((st = qf_certify_reference(s.ctx, etext, elen, &cpp, &s.ref, err))) goto done;
    rep->ref_ppl = qf_certify_ref_ppl(s.ref);
    rep->seconds_reference = qf_now_sec() - tr;
    logf_(p, "reference (f32 KV): PPL %.4f over the evaluation split (%.1f s)", rep->ref_ppl, rep->seconds_reference);
    for (int i = 0; i < N_METHODS; i++)
        if (want[i] && (st = measure_method(p, &s, i, rep, &skip_cap, err))) goto done;
    if (rep->n_points == 0) {
        st = qf_fail(err, QF_ERR_ARG, "analyze: no method could be measured%s%s", rep->n_skipped ? ": " : "",
                     rep->n_skipped ? rep->skipped[0].reason : "");
        goto done;
    }
    st = qf_analyze_judge(rep, asked, n_asked, err);
done:
    state_free(&s);
    rep->seconds = qf_now_sec() - t0;
    return st;
}

/* ---- judging ---- */

static double rate_of(const qf_analyze_report *rep, const qf_analyze_point *pt) {
    return rep->tables_in_rate ? pt->bits_per_element_with_tables : pt->bits_per_element;
}

static bool usable(const qf_analyze_report *rep, const qf_analyze_point *pt) {
    return isfinite(rate_of(rep, pt)) && isfinite(pt->kld_mean);
}

/* Sort point indices by rate, then mean KLD, then index (insertion sort: a few dozen points). */
static void sort_by_rate(const qf_analyze_report *rep, int *idx, int n) {
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0; b--) {
            const qf_analyze_point *x = &rep->points[idx[b - 1]], *y = &rep->points[idx[b]];
            double rx = rate_of(rep, x), ry = rate_of(rep, y);
            bool swap = rx > ry || (rx == ry && (x->kld_mean > y->kld_mean ||
                                                 (x->kld_mean == y->kld_mean && idx[b - 1] > idx[b])));
            if (!swap) break;
            int t = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = t;
        }
}

/* "kv-dict 256x8-f16", or just "q4_0+hadamard" when the label is the method */
static const char *pt_name(const qf_analyze_point *pt, char *out, size_t cap) {
    if (!strcmp(pt->method, pt->label)) snprintf(out, cap, "%s", pt->method);
    else snprintf(out, cap, "%s %s", pt->method, pt->label);
    return out;
}

/* "4.50 b (KLD 1.85e-02, ΔPPL +3.78%)", "8.00 b (per-head: KLD ...)" */
static void describe(const qf_analyze_report *rep, const qf_analyze_point *pt, char *out, size_t cap) {
    bool same = !strcmp(pt->method, pt->label);
    snprintf(out, cap, "%.2f b (%s%sKLD %.2e, ΔPPL %+.2f%%%s)", rate_of(rep, pt), same ? "" : pt->label,
             same ? "" : ": ", pt->kld_mean, 100 * pt->delta_ppl, pt->passes_gate ? "" : ", fails the default gate");
}

static void append(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *dst, size_t cap, const char *fmt, ...) {
    size_t n = strlen(dst);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst + n, cap - n, fmt, ap);
    va_end(ap);
}

qf_status qf_analyze_judge(qf_analyze_report *rep, const char *const *methods, int n, qf_error *err) {
    free(rep->frontier);
    free(rep->verdicts);
    rep->frontier = NULL;
    rep->verdicts = NULL;
    rep->n_frontier = rep->n_verdicts = 0;
    const int np = rep->n_points;
    rep->frontier = malloc(sizeof(int) * (size_t)(np > 0 ? np : 1));
    rep->verdicts = calloc((size_t)(n > 0 ? n : 1), sizeof *rep->verdicts);
    if (!rep->frontier || !rep->verdicts) return qf_fail(err, QF_ERR_NOMEM, "analyze: out of memory");
    qf_analyze_point *P = rep->points;
    for (int i = 0; i < np; i++) {
        P[i].on_frontier = usable(rep, &P[i]);
        P[i].dominated_by = -1;
        P[i].within_noise = false;
        for (int j = 0; j < np && P[i].on_frontier; j++) {
            if (j == i || !usable(rep, &P[j])) continue;
            double ri = rate_of(rep, &P[i]), rj = rate_of(rep, &P[j]);
            if (rj <= ri && P[j].kld_mean <= P[i].kld_mean && (rj < ri || P[j].kld_mean < P[i].kld_mean))
                P[i].on_frontier = false;
        }
        if (P[i].on_frontier) rep->frontier[rep->n_frontier++] = i;
    }
    sort_by_rate(rep, rep->frontier, rep->n_frontier);
    /* a dominated point is beaten by the frontier point with the lowest KLD at no more bits */
    for (int i = 0; i < np; i++) {
        if (P[i].on_frontier || !usable(rep, &P[i])) continue;
        for (int k = 0; k < rep->n_frontier; k++) {
            const qf_analyze_point *f = &P[rep->frontier[k]];
            if (rate_of(rep, f) > rate_of(rep, &P[i])) break;
            if (P[i].dominated_by < 0 || f->kld_mean < P[P[i].dominated_by].kld_mean) /* ties: the cheaper */
                P[i].dominated_by = rep->frontier[k];
        }
        if (P[i].dominated_by >= 0) {
            const qf_analyze_point *f = &P[P[i].dominated_by];
            double se = sqrt(P[i].kld_err * P[i].kld_err + f->kld_err * f->kld_err);
            P[i].within_noise = P[i].kld_mean - f->kld_mean <= 2 * se;
        }
    }
    for (int m = 0; m < n; m++) {
        qf_analyze_verdict *v = &rep->verdicts[rep->n_verdicts++];
        snprintf(v->method, sizeof v->method, "%s", methods[m]);
        char on[512] = "", off[512] = "", d[128];
        for (int i = 0; i < np; i++) {
            if (strcmp(P[i].method, methods[m]) != 0) continue;
            v->n_points++;
            if (P[i].on_frontier) {
                v->n_on_frontier++;
                describe(rep, &P[i], d, sizeof d);
                append(on, sizeof on, "%s%s", on[0] ? ", " : "", d);
            } else if (P[i].dominated_by >= 0) {
                const qf_analyze_point *f = &P[P[i].dominated_by];
                char fn[80], lab[48] = "";
                if (strcmp(P[i].method, P[i].label) != 0) snprintf(lab, sizeof lab, " (%s)", P[i].label);
                append(off, sizeof off, "%sat %.2f b%s by %s (%.2f b, KLD %.2e vs %.2e%s)", off[0] ? "; " : "",
                       rate_of(rep, &P[i]), lab, pt_name(f, fn, sizeof fn), rate_of(rep, f), f->kld_mean,
                       P[i].kld_mean, P[i].within_noise ? ", within noise" : "");
            } else {
                append(off, sizeof off, "%sat %s: no finite KLD", off[0] ? "; " : "", P[i].label);
            }
        }
        if (v->n_points == 0) {
            const char *why = NULL;
            for (int k = 0; k < rep->n_skipped && !why; k++)
                if (!strcmp(rep->skipped[k].method, methods[m])) why = rep->skipped[k].reason;
            snprintf(v->verdict, sizeof v->verdict, "not measured%s%s", why ? ": " : "", why ? why : "");
        } else if (v->n_on_frontier == v->n_points) {
            snprintf(v->verdict, sizeof v->verdict, "on the frontier at %s", on);
        } else if (v->n_on_frontier == 0) {
            snprintf(v->verdict, sizeof v->verdict, "dominated %s", off);
        } else {
            snprintf(v->verdict, sizeof v->verdict, "on the frontier at %s; dominated elsewhere: %s", on, off);
        }
    }
    return QF_OK;
}

/* ---- output ---- */

void qf_analyze_report_print(const qf_analyze_report *rep, FILE *fp) {
    fprintf(fp,
            "KV methods on the end metric: %d layers x %d kv heads x head_dim %d; held-out evaluation split "
            "(%zu documents): %d chunks of %d tokens, %lld scored; reference f32 KV PPL %.4f\n",
            rep->n_layer, rep->n_head_kv, rep->head_dim, rep->eval_docs, rep->n_chunks, rep->n_ctx,
            (long long)rep->n_scored, rep->ref_ppl);
    fprintf(fp, "%-14s %-12s %7s %8s %9s %10s %10s %7s %4s %s\n", "method", "rate", "bits", "+tables", "ΔPPL%",
            "KLD mean", "KLD p99", "top-1%", "gate", "frontier");
    for (int i = 0; i < rep->n_points; i++) {
        const qf_analyze_point *pt = &rep->points[i];
        char fr[96] = "yes";
        if (!pt->on_frontier) {
            char fn[80];
            if (pt->dominated_by >= 0)
                snprintf(fr, sizeof fr, "no: %s%s", pt_name(&rep->points[pt->dominated_by], fn, sizeof fn),
                         pt->within_noise ? " (within noise)" : "");
            else
                snprintf(fr, sizeof fr, "no");
        }
        fprintf(fp, "%-14s %-12s %7.3f %8.3f %+9.4f %10.3e %10.3e %7.2f %4s %s\n", pt->method, pt->label,
                pt->bits_per_element, pt->bits_per_element_with_tables, 100 * pt->delta_ppl, pt->kld_mean, pt->kld_p99,
                100 * pt->top1, pt->passes_gate ? "pass" : "fail", fr);
    }
    for (int k = 0; k < rep->n_skipped; k++)
        fprintf(fp, "%-14s %-12s not measured: %s\n", rep->skipped[k].method, rep->skipped[k].label,
                rep->skipped[k].reason);
    fprintf(fp, "frontier (%s vs mean KLD):", rep->tables_in_rate ? "bits per element with tables" : "bits per element");
    for (int k = 0; k < rep->n_frontier; k++) {
        const qf_analyze_point *pt = &rep->points[rep->frontier[k]];
        char fn[80];
        fprintf(fp, "%s %s %.2f b %.2e", k ? " |" : "", pt_name(pt, fn, sizeof fn), rate_of(rep, pt), pt->kld_mean);
    }
    fputc('\n', fp);
    fprintf(fp, "verdicts:\n");
    for (int m = 0; m < rep->n_verdicts; m++)
        fprintf(fp, "  %-14s %s\n", rep->verdicts[m].method, rep->verdicts[m].verdict);
}

qf_status qf_analyze_write_svg(const qf_analyze_report *rep, const char *path, qf_error *err) {
    int np = rep->n_points;
    double *x = malloc(sizeof(double) * (size_t)(np + 1) * 2), *y = x ? x + np + 1 : NULL;
    double *fx = malloc(sizeof(double) * (size_t)(rep->n_frontier + 1) * 2), *fy = fx ? fx + rep->n_frontier + 1 : NULL;
    const char **lab = malloc(sizeof(char *) * (size_t)(np + 1));
    qf_plot_curve *cv = malloc(sizeof *cv * (size_t)(rep->n_verdicts + 1));
    int *order = malloc(sizeof(int) * (size_t)(np + 1));
    qf_status st = QF_OK;
    if (!x || !fx || !lab || !cv || !order) {
        st = qf_fail(err, QF_ERR_NOMEM, "analyze: svg: out of memory");
        goto done;
    }
    /* one curve per method, its points by increasing rate */
    int nc = 0, used = 0;
    for (int m = 0; m < rep->n_verdicts; m++) {
        int k0 = used;
        for (int i = 0; i < np; i++)
            if (!strcmp(rep->points[i].method, rep->verdicts[m].method) && usable(rep, &rep->points[i]))
                order[used++] = i;
        if (used == k0) continue;
        sort_by_rate(rep, order + k0, used - k0);
        for (int k = k0; k < used; k++) {
            const qf_analyze_point *pt = &rep->points[order[k]];
            x[k] = rate_of(rep, pt);
            y[k] = pt->kld_mean;
            lab[k] = pt->label;
        }
        cv[nc++] = (qf_plot_curve){.name = rep->verdicts[m].method, .n = used - k0, .x = x + k0, .y = y + k0,
                                   .label = lab + k0};
    }
    for (int k = 0; k < rep->n_frontier; k++) {
        fx[k] = rate_of(rep, &rep->points[rep->frontier[k]]);
        fy[k] = rep->points[rep->frontier[k]].kld_mean;
    }
    char title[160];
    snprintf(title, sizeof title, "KV cache methods: mean KLD vs f32 KV on held-out text (reference PPL %.3f)",
             rep->ref_ppl);
    qf_plot pl = {.title = title,
                  .x_label = rep->tables_in_rate ? "bits per element (per-token overheads and side tables included)"
                                                 : "bits per element (per-token overheads included)",
                  .y_label = "mean KL divergence (log)",
                  .n_curves = nc,
                  .curves = cv,
                  .n_front = rep->n_frontier,
                  .front_x = fx,
                  .front_y = fy,
                  .front_name = "Pareto frontier"};
    st = qf_plot_write_svg(&pl, path, err);
done:
    free(x);
    free(fx);
    free(lab);
    free(cv);
    free(order);
    return st;
}
