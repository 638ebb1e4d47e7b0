/* pipeline.c: run one calibration job (corpus -> capture -> learn -> certify -> package) or
 * a sweep of kv-dict configurations over one capture and one reference pass. Each stage maps
 * its failures onto the forge taxonomy (CorpusEmpty, OllamaUnavailable, CaptureFailed,
 * CertifyFailed, PackageFailed) and prints one line on the job's log. The certificate records
 * the exact evaluation setup (eval text SHA-256, chunk size, chunks, reference KV mode,
 * threads) so `qforge ppl --artifact` reproduces its candidate PPL (docs/forge.md). */
#include <math.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qforge/artifact_bind.h"
#include "qforge/awq.h"
#include "qforge/capture.h"
#include "qforge/corpus.h"
#include "qforge/forge.h"
#include "qforge/ppl.h"
#include "qforge/kv_rq.h"
#include "engine/kv_rq_klt.h"
#include "format/kv_rq_row.h"
#include "kernels/hadamard.h"
#include "util/par.h"
#include "util/util.h"

/* The job's calibration budgets with "0 = default" (forge.h) decoded, in this one place:
 * calib_tokens = tokens captured (0 = all), per_layer = K (and V) vectors kept per layer. */
typedef struct {
    int64_t calib_tokens, per_layer;
} job_budget;
static job_budget job_budgets(const qf_job *j) {
    job_budget b = {.calib_tokens = j->max_calib_tokens == 0 ? QF_JOB_DEFAULT_BUDGET
                                    : j->max_calib_tokens < 0 ? 0 : j->max_calib_tokens,
                    .per_layer = j->capture_per_layer > 0 ? j->capture_per_layer : QF_JOB_DEFAULT_BUDGET};
    return b;
}

void qf_job_default(qf_job *j) {
    memset(j, 0, sizeof *j);
    j->kind = QF_ARTIFACT_KV_INT8;
    j->gate = qf_gate_default();
    j->n_ctx = 256;
    j->ref_kv = QF_KV_F32;
    j->seed = 1;
    j->int8_percentile = 100.0;
    j->dict_atoms = 256;
    j->dict_sparsity = 8;
    j->dict_iters = 10;
    j->dict_coef = QF_KV_COEF_F16;
    j->rq_sink = j->rq_window = -1;
    j->rq_k_alpha = 0.5;
    j->rq_sens_chunks = 0; /* 2, or 4 with format 3 (its sensitivity runs are cheap) */
    j->rq_prerope = -1;
    j->rq_qaware = 0;
    j->rq_vpred = -1;
    j->rq_vpred_noise = 0.2;
    j->rq_v_alpha = 0.5;
    j->rq_min_bits = 0;
    j->rq_transform = -1;
    j->rq_klt_eighths = 1;
    j->dict_version = 1;
}

void qf_job_report_free(qf_job_report *rep) {
    if (rep) qf_certificate_free(&rep->cert);
}

static void stage(const qf_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void stage(const qf_job *j, const char *fmt, ...) {
    if (!j->log || qf_mpi_rank() != 0) return; /* under mpirun rank 0 tells the story */
    va_list ap;
    va_start(ap, fmt);
    fputs("calibrate: ", j->log);
    vfprintf(j->log, fmt, ap);
    fputc('\n', j->log);
    fflush(j->log);
    va_end(ap);
}

/* Re-label a failure with a stage's status, keeping resource errors as they are. */
static qf_status as_stage(qf_error *err, qf_status st, qf_status stage_status, const char *what) {
    if (st == QF_OK) return QF_OK;
    qf_error_prefix(err, "%s: ", what);
    if (st == QF_ERR_NOMEM) return st;
    if (err) err->code = stage_status;
    return stage_status;
}

/* ---- shared stages ---- */

typedef struct {
    qf_corpus *corpus;
    const qf_corpus_info *info;
    qf_model *model;
    qf_context *ctx;
    qf_capture *cap;
    qf_certify_ref *ref;
    int64_t calib_tokens;
    int n_ctx, eval_chunks;
    uint8_t eval_sha[32];
    /* kv-int8 with --device cuda: certification ran on the GPU; its first evaluation chunk was
     * scored again on the CPU path (PPL of that chunk on each device) */
    bool cert_gpu;
    double recheck_gpu_ppl, recheck_cpu_ppl;
} shared;

static void shared_free(shared *s) {
    qf_certify_ref_free(s->ref);
    qf_capture_free(s->cap);
    qf_context_free(s->ctx);
    qf_model_free(s->model);
    qf_corpus_free(s->corpus);
    memset(s, 0, sizeof *s);
}

static qf_status stage_corpus(const qf_job *j, shared *s, qf_job_report *rep, qf_error *err) {
    double t0 = qf_now_sec();
    if (!(s->corpus = qf_corpus_new())) return qf_fail(err, QF_ERR_NOMEM, "corpus: out of memory");
    qf_status st = QF_OK;
    for (int i = 0; i < j->n_corpus_paths && !st; i++) st = qf_corpus_add_path(s->corpus, j->corpus_paths[i], err);
    if (!st && j->builtin) st = qf_corpus_add_builtin(s->corpus, err);
    if (!st && j->ollama_url) {
        qf_ollama_opts o = {.url = j->ollama_url, .model = j->ollama_model, .n_docs = j->synth_docs > 0 ? j->synth_docs : 16};
        st = qf_corpus_synthesize_ollama(s->corpus, &o, err);
    }
    if (st) return st; /* CorpusEmpty / OllamaUnavailable / IO / FORMAT as the corpus stage says */
    if (j->n_corpus_paths == 0 && !j->builtin && !j->ollama_url)
        return qf_fail(err, QF_ERR_CORPUS_EMPTY, "corpus: no input given (a path, the built-in corpus or Ollama)");
    double frac = j->eval_frac > 0 ? j->eval_frac : QF_CORPUS_DEFAULT_EVAL_FRAC;
    if ((st = qf_corpus_finalize(s->corpus, frac, err))) return st;
    s->info = qf_corpus_get_info(s->corpus);
    if (s->info->n_eval_docs == 0 || s->info->n_calib_docs == 0)
        return qf_fail(err, QF_ERR_CORPUS_EMPTY,
                       "corpus: %zu document(s): certification needs at least one calibration and one evaluation "
                       "document (disjoint); add text",
                       s->info->n_docs);
    size_t elen;
    const char *etext = qf_corpus_eval_text(s->corpus, &elen);
    qf_sha256(etext, elen, s->eval_sha);
    if (j->eval_out_path && qf_mpi_rank() == 0 && (st = qf_write_file_atomic(j->eval_out_path, etext, elen, err)))
        return st;
    rep->seconds_corpus = qf_now_sec() - t0;
    stage(j, "[1/5 corpus] %zu documents (%zu calibration, %zu evaluation), sha256 %.16s...", s->info->n_docs,
          s->info->n_calib_docs, s->info->n_eval_docs, s->info->sha256_hex);
    return QF_OK;
}

static qf_status stage_model(const qf_job *j, shared *s, qf_error *err) {
    if (!(s->model = qf_model_load(j->model_path, err))) return err ? err->code : QF_ERR_IO;
    qf_context_params cp = qf_context_default_params();
    s->n_ctx = j->n_ctx_list > 0 ? j->ctx_list[0] : j->n_ctx > 0 ? j->n_ctx : 256;
    cp.n_ctx = s->n_ctx;
    cp.n_batch = s->n_ctx; /* as qforge ppl without -b */
    cp.n_threads = j->n_threads;
    cp.kv_k = cp.kv_v = j->ref_kv;
    /* Artifacts are certified on the CPU path, except kv-int8, kv-rq, awq and kv-dict v1 under an
     * explicit --device cuda: the GPU runs their every row layout (reference, candidates, kv-rq's
     * sensitivity runs, the free baseline; awq's model and its RTN baseline) and the capture
     * taps they need. kv-dict v2 stays on the CPU (its codes are not the GPU cache's); a v1
     * dictionary's rows are OMP-encoded on the GPU into the host encoder's bytes (docs/gpu.md) */
    s->cert_gpu = j->capture_device == QF_DEVICE_CUDA &&
                  (j->kind == QF_ARTIFACT_KV_INT8 || j->kind == QF_ARTIFACT_KV_RQ || j->kind == QF_ARTIFACT_AWQ ||
                   (j->kind == QF_ARTIFACT_KV_DICT && j->dict_version == 1));
    cp.device = s->cert_gpu ? QF_DEVICE_CUDA : QF_DEVICE_CPU;
    /* every GEMM in f32 on the GPU: the f16 route's input rounding differs between the
     * reference (fused f16 q|k|v) and quantized-KV passes (f32 K/V), which shows up in the KLDs
     * a verdict compares; in f32 the GPU's numbers follow the CPU's */
    if (s->cert_gpu) cp.cuda.gemm_f32 = cp.cuda.attn_warp = true; /* and f32 attention for every cache */
    /* Certification computes in the canonical arithmetic (kernels/canon.h): where the model and
     * cache are covered (qf_context_canonical), every number is the same bits on the CPU and the
     * GPU, so the certificate does not depend on the device; the GPU's f32 knobs above are its
     * route where they are not */
    cp.canonical = !j->arith_fast;
    if (!(s->ctx = qf_context_new(s->model, &cp, err))) return err ? err->code : QF_ERR_NOMEM;
    s->eval_chunks = j->eval_chunks == 0 ? 16 : j->eval_chunks < 0 ? 0 : j->eval_chunks;
    return QF_OK;
}

/* kv-rq's low-budget settings (keys before RoPE with V predicted from them, a 1-bit allocation
 * floor) up to a 3-bit budget: docs/kv-rq.md "Format 3 at 4 bits" measured them better at 2.5
 * and 3 bits on both demo models, worse at 4, mixed at 3.5 */
#define RQ_LOW_BUDGET_BITS 3.0

/* kv-rq keys before RoPE: asked for, or by default with a budget of at most RQ_LOW_BUDGET_BITS */
static bool rq_use_prerope(const qf_job *j) {
    return j->rq_prerope > 0 || (j->rq_prerope < 0 && j->rq_bits > 0 && j->rq_bits <= RQ_LOW_BUDGET_BITS);
}

/* kv-rq payload format 3 (KLT, per-coordinate widths): --rq-transform klt, or by default at any
 * --bits budget (docs/kv-rq.md "Format 3" has the measurement below 3 bits, "Format 3 at 4 bits"
 * above: at 4 bits on the 27m model at -c 2048 the Hadamard rows had 2.3x the free baseline's
 * mean KLD over the held-out split, format 3 0.26x) */
static bool rq_use_klt(const qf_job *j) { return j->rq_transform == 1 || (j->rq_transform < 0 && j->rq_bits > 0); }

/* The capture, and kv-rq's dense learning steps, may run on the GPU: --device cuda, or auto with
 * a GPU found (the learned fit is the CPU's bit for bit: test_cuda op_rq_learn) */
static bool may_use_gpu(const qf_job *j) {
    return j->capture_device == QF_DEVICE_CUDA || (j->capture_device == QF_DEVICE_AUTO && qf_cuda_available());
}

static qf_status stage_capture(const qf_job *j, shared *s, qf_job_report *rep, qf_error *err) {
    double t0 = qf_now_sec();
    const qf_tokenizer *tok = qf_model_tokenizer(s->model);
    size_t clen, n = 0;
    const char *ctext = qf_corpus_calib_text(s->corpus, &clen);
    int32_t *ids = NULL;
    qf_status st = qf_tokenize(tok, ctext, clen, qf_tokenizer_add_bos(tok), false, &ids, &n, err);
    if (st) return as_stage(err, st, QF_ERR_CAPTURE_FAILED, "capture: tokenizing the calibration text");
    /* kv-dict v2 learns keys before RoPE: the CPU tap (the GPU read-back route has post-RoPE K only) */
    bool prerope = (j->kind == QF_ARTIFACT_KV_DICT && j->dict_version == 2) || (j->kind == QF_ARTIFACT_KV_RQ && rq_use_prerope(j));
    qf_capture_params cp = {.max_per_layer = job_budgets(j).per_layer,
                            .activations = false, .seed = j->seed, .k_prerope = prerope};
    s->cap = qf_capture_new(qf_model_hparams(s->model), &cp, err);
    if (!s->cap) {
        free(ids);
        return as_stage(err, err ? err->code : QF_ERR_NOMEM, QF_ERR_CAPTURE_FAILED, "capture");
    }
    int64_t max_tok = job_budgets(j).calib_tokens;
    /* the GPU read-back route when asked for or found; the CPU context otherwise */
    qf_context *gpu = NULL;
    const bool on_gpu = qf_context_device(s->ctx) == QF_DEVICE_CUDA; /* certification's GPU context: capture there */
    if (!on_gpu && !prerope && may_use_gpu(j)) {
        qf_context_params gp = *qf_context_params_get(s->ctx);
        gp.device = QF_DEVICE_CUDA;
        if (!(gpu = qf_context_new(s->model, &gp, err))) {
            free(ids);
            return as_stage(err, err ? err->code : QF_ERR_DEVICE, QF_ERR_CAPTURE_FAILED, "capture");
        }
    }
    st = qf_capture_run(gpu ? gpu : s->ctx, s->cap, ids, (int64_t)n, s->n_ctx, max_tok, j->progress, err);
    if (on_gpu) gpu = NULL; /* not ours to free */
    qf_context_free(gpu);
    free(ids);
    if (st) return as_stage(err, st, QF_ERR_CAPTURE_FAILED, "capture");
    s->calib_tokens = qf_capture_tokens_seen(s->cap);
    qf_kv_capture_view v = qf_capture_kv_view(s->cap);
    if (s->calib_tokens <= 0 || !v.k || v.n_k[0] <= 0)
        return qf_fail(err, QF_ERR_CAPTURE_FAILED, "capture: no KV vectors were captured");
    rep->calib_tokens = s->calib_tokens;
    rep->seconds_capture = qf_now_sec() - t0;
    stage(j, "[2/5 capture] %lld calibration tokens on the %s, %lld K and %lld V vectors per layer kept",
          (long long)s->calib_tokens, gpu || on_gpu ? "GPU (read back)" : "CPU", (long long)v.n_k[0],
          (long long)v.n_v[0]);
    return QF_OK;
}

static qf_status stage_reference(const qf_job *j, shared *s, qf_error *err) {
    size_t elen;
    const char *etext = qf_corpus_eval_text(s->corpus, &elen);
    /* kv-int8 (the kind that certifies on the GPU too): the gate judged at 3 significant digits
     * on every device, so the CPU's and the GPU's verdicts agree wherever the two devices agree
     * to that precision (docs/gpu.md, "The certificate, CPU vs GPU") */
    qf_certify_params p = {.n_ctx = s->n_ctx, .n_chunks = s->eval_chunks, .progress = j->progress,
                           .sig_digits = j->kind == QF_ARTIFACT_KV_INT8 ? QF_CERT_SIG_DIGITS_INT8 : 0};
    qf_status st = qf_certify_reference(s->ctx, etext, elen, &p, &s->ref, err);
    if (st) return st;
    char chunks[24];
    if (s->eval_chunks > 0) snprintf(chunks, sizeof chunks, "%d", s->eval_chunks);
    else snprintf(chunks, sizeof chunks, "all");
    stage(j, "[4/5 certify] reference (kv %s): PPL %.4f over %s chunks of %d evaluation tokens%s",
          qf_kv_mode_name(j->ref_kv), qf_certify_ref_ppl(s->ref), chunks, s->n_ctx, s->cert_gpu ? " (GPU)" : "");
    if (s->cert_gpu && !s->recheck_cpu_ppl) { /* the first chunk again, on the GPU and on the CPU path */
        qf_ppl_params pp = qf_ppl_default_params();
        pp.n_ctx = s->n_ctx;
        pp.n_chunks = 1;
        qf_ppl_result rg, rc;
        qf_context_params cp = *qf_context_params_get(s->ctx);
        cp.device = QF_DEVICE_CPU;
        qf_context *cpu = NULL;
        if ((st = qf_perplexity_text(s->ctx, etext, elen, &pp, &rg, err)) ||
            !(cpu = qf_context_new(s->model, &cp, err)) ||
            (st = qf_perplexity_text(cpu, etext, elen, &pp, &rc, err))) {
            qf_context_free(cpu);
            if (!st) st = err ? err->code : QF_ERR_NOMEM;
            if (err) qf_error_prefix(err, "certify: the CPU re-check of the first chunk: ");
            return st;
        }
        qf_context_free(cpu);
        s->recheck_gpu_ppl = rg.ppl, s->recheck_cpu_ppl = rc.ppl;
        stage(j, "[4/5 certify] first chunk re-checked on the CPU path: PPL %.6f (GPU) vs %.6f (CPU), rel. diff %.2e",
              rg.ppl, rc.ppl, fabs(rg.ppl / rc.ppl - 1));
    }
    return QF_OK;
}

/* ---- MPI ---- */

/* Every rank runs the same inputs: the corpus and the model are compared with rank 0's before
 * any work (docs/mpi.md). */
static qf_status same_inputs(const shared *s, qf_error *err) {
    qf_status st = qf_par_same(s->info->sha256, 32, "corpus SHA-256", err);
    if (!st) st = qf_par_same(qf_model_sha256(s->model), 32, "model SHA-256", err);
    return st;
}

/* A payload learned on rank `owner` (its learning status in *learn_st, message in *lerr)
 * reaches every rank: the status and message first, then the payload as the artifact body's
 * exact bytes (serialize / read back, which the loader proves lossless). Collective; with one
 * rank a no-op. Returns only communication failures. */
static qf_status share_payload(int owner, qf_artifact_kind kind, qf_status *learn_st, qf_error *lerr, qf_payload *pl,
                               qf_error *err) {
    if (qf_mpi_size() == 1) return QF_OK;
    const bool mine = qf_mpi_rank() == owner;
    struct {
        int32_t st;
        char msg[sizeof lerr->msg];
    } head;
    memset(&head, 0, sizeof head);
    uint8_t *buf = NULL;
    size_t len = 0;
    qf_status st = QF_OK;
    if (mine && !*learn_st) {
        qf_certificate c;
        qf_certificate_init(&c, kind);
        qf_error e = {0};
        if ((*learn_st = qf_artifact_serialize(&c, pl, NULL, &buf, &len, &e))) *lerr = e;
        qf_certificate_free(&c);
    }
    if (mine) {
        head.st = (int32_t)*learn_st;
        snprintf(head.msg, sizeof head.msg, "%s", *learn_st ? lerr->msg : "");
    }
    if ((st = qf_par_bcast(&head, sizeof head, owner, err))) goto out;
    *learn_st = (qf_status)head.st;
    if (*learn_st) {
        if (!mine) qf_fail(lerr, *learn_st, "%s", head.msg);
        goto out;
    }
    if ((st = qf_par_bcast_alloc((void **)&buf, &len, owner, err))) goto out;
    if (!mine) {
        qf_artifact a;
        if ((st = qf_artifact_read_mem(buf, len, NULL, &a, err))) goto out;
        qf_payload_free(pl);
        *pl = a.payload;
        memset(&a.payload, 0, sizeof a.payload);
        qf_artifact_free(&a);
    }
out:
    free(buf);
    return st;
}

/* ---- learners ---- */

/* kv-int8 candidates: the row layout of K and V (payload "k_layout" / "v_layout") and how the
 * static scales are fitted. A static layout on rotated rows is fitted on rotated vectors; the
 * per-token layouts carry their scale in the codes and get placeholder scales of 1. */
typedef struct {
    const char *name;
    const char *layout[2]; /* K, V: "static", "static-rot", "token-rot", "token", "ec-rot" */
    qf_kv_scale_mode mode;
} int8_candidate;

/* docs/kv-baselines.md "kv-int8": on held-out text the static layouts lose to plain q8_0 (the
 * calibrated range clips or wastes resolution: per-channel 28x, rotated per-channel 13x, K
 * per-channel + V per-token 23x q8_0's KLD), the rotated per-token layout beats it at 8.0 bits;
 * the original per-channel layout stays as the second candidate, for the record */
static const int8_candidate int8_candidates[] = {
    /* entropy-coded rotated rows: about 0.6x (head_dim 128) / 0.7x (64) token-rot's squared error */
    {"ec-rot", {"ec-rot", "ec-rot"}, QF_KV_SCALE_PER_HEAD},          /* placeholder scales: [L, H] of 1 */
    {"token-rot", {"token-rot", "token-rot"}, QF_KV_SCALE_PER_HEAD}, /* placeholder scales: [L, H] of 1 */
    {"per-channel", {"static", "static"}, QF_KV_SCALE_PER_CHANNEL},
};
#define N_INT8_CANDIDATES ((int)(sizeof int8_candidates / sizeof int8_candidates[0]))

static qf_status learn_int8(const qf_job *j, const shared *s, const int8_candidate *cand, qf_payload *pl,
                            qf_error *err) {
    qf_kv_scale_mode mode = cand->mode;
    qf_kv_capture_view v = qf_capture_kv_view(s->cap);
    int L = v.n_layer, H = v.n_kv_head, D = v.head_dim;
    size_t per = (size_t)H * D;
    float *sc[2] = {malloc((size_t)L * per * sizeof(float)), malloc((size_t)L * per * sizeof(float))};
    float *rx = NULL;
    qf_status st = QF_OK;
    if (!sc[0] || !sc[1]) st = qf_fail(err, QF_ERR_NOMEM, "learn: out of memory");
    for (int sidx = 0; sidx < 2 && !st; sidx++)
        st = qf_payload_add_string(pl, sidx ? "v_layout" : "k_layout", cand->layout[sidx], err);
    for (int l = 0; l < L && !st; l++)
        for (int sidx = 0; sidx < 2 && !st; sidx++) {
            const float *x = sidx ? v.v[l] : v.k[l];
            int64_t n = sidx ? v.n_v[l] : v.n_k[l];
            const char *lay = cand->layout[sidx];
            if (!strncmp(lay, "token", 5) || !strcmp(lay, "ec-rot")) { /* no static scale is used */
                for (size_t i = 0; i < per; i++) sc[sidx][(size_t)l * per + i] = 1.0f;
                continue;
            }
            if (!strcmp(lay, "static-rot")) {
                free(rx);
                if (!(rx = malloc((size_t)n * D * sizeof(float)))) {
                    st = qf_fail(err, QF_ERR_NOMEM, "learn: out of memory");
                    break;
                }
                memcpy(rx, x, (size_t)n * D * sizeof(float));
                qf_hadamard_rows(rx, D, (int)n);
                x = rx;
            }
            st = qf_kv_int8_fit(x, n, H, D, mode, j->int8_percentile, sc[sidx] + (size_t)l * per, err);
            if (!st) /* a channel that never moved (all zero) still needs a positive scale */
                for (size_t i = 0; i < per; i++)
                    if (!(sc[sidx][(size_t)l * per + i] > 0)) sc[sidx][(size_t)l * per + i] = 1e-6f;
        }
    if (!st) {
        const char *names[2] = {"k_scale", "v_scale"};
        for (int sidx = 0; sidx < 2 && !st; sidx++) {
            if (mode == QF_KV_SCALE_PER_CHANNEL) {
                int64_t shape[3] = {L, H, D};
                st = qf_payload_add_f32(pl, names[sidx], sc[sidx], 3, shape, err);
            } else {
                float *ph = malloc((size_t)L * H * sizeof(float));
                if (!ph) {
                    st = qf_fail(err, QF_ERR_NOMEM, "learn: out of memory");
                    break;
                }
                for (int i = 0; i < L * H; i++) ph[i] = sc[sidx][(size_t)i * D];
                int64_t shape[2] = {L, H};
                st = qf_payload_add_f32(pl, names[sidx], ph, 2, shape, err);
                free(ph);
            }
        }
    }
    free(sc[0]);
    free(sc[1]);
    free(rx);
    return st;
}

/* The error bound of one (layer, stream): the q-quantile of the relative residual at the cap
 * over (up to 4096, evenly strided) training vectors, coded by the engine's encoder. */
static qf_status dict_tol(const qf_kv_dict *d, const float *x, int64_t n, int s, double q, int n_threads,
                          float *out, qf_error *err) {
    int64_t m = n < 4096 ? n : 4096;
    float *xs = malloc((size_t)m * d->head_dim * sizeof(float)), *coef = malloc((size_t)m * s * sizeof(float)),
          *rec = malloc((size_t)d->head_dim * sizeof(float));
    uint16_t *idx = malloc((size_t)m * s * sizeof(uint16_t));
    double *r = malloc((size_t)m * sizeof(double));
    qf_status st = QF_OK;
    if (!xs || !coef || !rec || !idx || !r) {
        st = qf_fail(err, QF_ERR_NOMEM, "learn: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < m; i++)
        memcpy(xs + (size_t)i * d->head_dim, x + (size_t)(i * n / m) * d->head_dim, (size_t)d->head_dim * sizeof(float));
    if ((st = qf_kv_dict_encode_ex(d, xs, m, s, 0, n_threads, idx, coef, NULL, err))) goto done;
    for (int64_t i = 0; i < m; i++) {
        qf_kv_dict_decode(d, idx + (size_t)i * s, coef + (size_t)i * s, s, 1, rec);
        r[i] = sqrt(qf_rel_mse(xs + (size_t)i * d->head_dim, rec, d->head_dim));
    }
    for (int64_t i = 1; i < m; i++) /* insertion sort: m <= 4096 */
        for (int64_t k = i; k > 0 && r[k - 1] > r[k]; k--) {
            double t = r[k];
            r[k] = r[k - 1], r[k - 1] = t;
        }
    int64_t at = (int64_t)(q * (double)(m - 1) + 0.5);
    *out = (float)fmin(r[at], 0.999);
done:
    free(xs), free(coef), free(rec), free(idx), free(r);
    return st;
}

/* One (layer, stream) dictionary of learn_dict, with its error bound when asked. What it
 * learns depends only on its vectors and the settings, not on the thread that runs it. */
typedef struct {
    const float *x;
    int64_t n;
    qf_kv_dict d;
    float tol;
    qf_status st;
    qf_error err;
} dict_unit;

typedef struct {
    dict_unit *u;
    int n_units, head_dim, sparsity;
    qf_kv_dict_params dp; /* n_threads: each dictionary's own */
    double tol_quantile;  /* > 0: dict_tol too */
    atomic_int next;
} dict_jobs;

/* Pool worker: takes the next unlearned dictionary until none is left. */
static void dict_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    dict_jobs *J = arg;
    for (int q; (q = atomic_fetch_add(&J->next, 1)) < J->n_units;) {
        dict_unit *u = &J->u[q];
        u->st = qf_kv_dict_learn(u->x, u->n, J->head_dim, &J->dp, &u->d, &u->err);
        if (!u->st && J->tol_quantile > 0)
            u->st = dict_tol(&u->d, u->x, u->n, J->sparsity, J->tol_quantile, J->dp.n_threads, &u->tol, &u->err);
    }
}

/* The kv-dict payload: one dictionary per (stream, layer), K layers first. They are learned
 * side by side, min(threads, dictionaries) at a time, each with threads / that many threads of
 * its own, so every core is busy even where one dictionary's k-SVD sweep is serial; the bits
 * are those of learning them one after another. */
static qf_status learn_dict(const qf_job *j, const shared *s, int n_atoms, int sparsity, qf_payload *pl,
                            qf_error *err) {
    qf_kv_capture_view v = qf_capture_kv_view(s->cap);
    qf_status st;
    bool v2 = j->dict_version == 2;
    if ((st = qf_payload_add_int(pl, "n_atoms", n_atoms, err)) || (st = qf_payload_add_int(pl, "sparsity", sparsity, err)) ||
        (st = qf_payload_add_string(pl, "coef", qf_kv_coef_name(j->dict_coef), err)))
        return st;
    /* v2: version 2, pre-RoPE keys, bit-packed indices, per-layer error bounds (absent = v1) */
    if (v2 && ((st = qf_payload_add_int(pl, "version", 2, err)) || (st = qf_payload_add_int(pl, "k_prerope", 1, err))))
        return st;
    const int L = v.n_layer, U = 2 * L;
    for (int q = 0; q < U; q++) { /* refused before any learning, in the payload's order */
        int sidx = q / L, l = q % L;
        int64_t n = sidx ? v.n_v[l] : v.n_k[l];
        if (n < n_atoms)
            return qf_fail(err, QF_ERR_CAPTURE_FAILED,
                           "layer %d %c has %lld captured vectors, fewer than the %d atoms to learn "
                           "(capture more tokens: --max-tok)",
                           l, sidx ? 'V' : 'K', (long long)n, n_atoms);
    }
    dict_jobs J = {.n_units = U, .head_dim = v.head_dim, .sparsity = sparsity,
                   .tol_quantile = v2 && j->dict_tol_quantile > 0 ? j->dict_tol_quantile : 0};
    qf_kv_dict_params_default(&J.dp);
    J.dp.n_atoms = n_atoms;
    J.dp.sparsity = sparsity;
    J.dp.iters = j->dict_iters > 0 ? j->dict_iters : 10;
    J.dp.seed = j->seed;
    J.dp.max_train = j->dict_max_train;
    int T = qf_context_params_get(s->ctx)->n_threads;
    if (T < 1) T = 1;
    const int outer = T < U ? T : U;
    J.dp.n_threads = T / outer;
    J.u = calloc((size_t)U, sizeof *J.u);
    float *tols = calloc((size_t)U, sizeof(float));
    qf_pool *pool = outer > 1 ? qf_pool_create(outer) : NULL;
    if (!J.u || !tols || (outer > 1 && !pool)) {
        st = qf_fail(err, QF_ERR_NOMEM, "learn: out of memory");
        goto done;
    }
    for (int q = 0; q < U; q++) {
        int sidx = q / L, l = q % L;
        J.u[q].x = sidx ? v.v[l] : v.k[l];
        J.u[q].n = sidx ? v.n_v[l] : v.n_k[l];
    }
    atomic_init(&J.next, 0);
    if (pool) qf_pool_run(pool, dict_worker, &J);
    else dict_worker(&J, 0, 1);
    for (int q = 0; q < U && !st; q++) { /* the first failure in the payload's order */
        if (!(st = J.u[q].st)) continue;
        if (err) {
            *err = J.u[q].err;
            qf_error_prefix(err, "layer %d %c: ", q % L, q / L ? 'V' : 'K'); /* the stage adds "learn: " */
        }
    }
    for (int q = 0; q < U && !st; q++) {
        char name[32];
        snprintf(name, sizeof name, "%c.%d", q / L ? 'v' : 'k', q % L);
        int64_t shape[2] = {n_atoms, v.head_dim};
        st = qf_payload_add_f32(pl, name, J.u[q].d.atoms, 2, shape, err);
        tols[q] = J.u[q].tol;
    }
    if (!st && J.tol_quantile > 0) {
        int64_t shape[1] = {L};
        st = qf_payload_add_f32(pl, "k_tol", tols, 1, shape, err);
        if (!st) st = qf_payload_add_f32(pl, "v_tol", tols + L, 1, shape, err);
    }
done:
    qf_pool_free(pool);
    if (J.u)
        for (int q = 0; q < U; q++) qf_kv_dict_free(&J.u[q].d);
    free(J.u);
    free(tols);
    return st;
}

/* ---- certificate ---- */

static double f16_bytes_per_token(const qf_model *m) {
    const qf_hparams *hp = qf_model_hparams(m);
    return (double)hp->n_layer * hp->n_head_kv * hp->head_dim * 2.0 * 2.0;
}

/* The smallest context n at which the payload's rate at n plus its T bytes of tables amortized
 * over n is at most bits (the free baseline's); both terms fall with n, so a bisection finds it.
 * 0 when no context up to 2^24 gets there. */
static int tables_pay_off(qf_artifact_kind kind, const qf_payload *p, const qf_hparams *hp, double T, double bits) {
    double E = (double)hp->n_layer * hp->n_head_kv * hp->head_dim * 2;
    if (!isfinite(T) || !(bits > 0) || !(E > 0)) return 0;
#define WITH(n) (qf_artifact_bits_per_element(kind, p, hp, (n)) + T * 8 / (E * (n)))
    int lo = 1, hi = 1 << 24;
    if (!(WITH(hi) <= bits)) return 0;
    while (lo < hi) { /* WITH(hi) <= bits throughout */
        int mid = lo + (hi - lo) / 2;
        if (WITH(mid) <= bits) hi = mid;
        else lo = mid + 1;
    }
#undef WITH
    return hi;
}

/* The packaged payload's rate at its largest certified context (the capture window n_ctx when
 * none is larger), its fixed tables, and where they pay off against the free baseline */
static void report_rate(qf_job_report *rep, qf_artifact_kind kind, const qf_payload *best, const qf_hparams *hp,
                        int n_ctx) {
    int max_ctx = n_ctx;
    for (int ci = 0; ci < rep->n_certified_ctx; ci++)
        if (rep->certified_ctx[ci] > max_ctx) max_ctx = rep->certified_ctx[ci];
    rep->bits_per_element = qf_artifact_bits_per_element(kind, best, hp, max_ctx);
    rep->table_bytes = qf_artifact_table_bytes(kind, best);
    if (rep->result.has_baseline)
        rep->tables_pay_off_ctx = tables_pay_off(kind, best, hp, rep->table_bytes, rep->result.baseline_bits);
}

/* The keys issue 15 added to the certificate's config (docs/artifact-format.md "Gate and context
 * keys"): the gate's p99 / two-sided / baseline switches, the free baseline's numbers, the rate,
 * and the numbers at every context of the --ctx list with the list of those that passed. */
static qf_status add_gate_keys(qf_payload *cf, const qf_job_report *rep, qf_error *err) {
    const qf_certify_result *r = &rep->result;
    const qf_gate *g = &r->gate;
    qf_status st = QF_OK;
    if (!st && g->has_max_kld_p99) st = qf_payload_add_float(cf, "gate.max_kld_p99", g->max_kld_p99, err);
    if (!st) st = qf_payload_add_int(cf, "gate.two_sided", g->two_sided, err);
    if (!st) st = qf_payload_add_int(cf, "gate.vs_baseline", g->vs_baseline, err);
    if (!st && isfinite(rep->bits_per_element)) st = qf_payload_add_float(cf, "bits_per_element", rep->bits_per_element, err);
    if (!st && isfinite(rep->table_bytes)) st = qf_payload_add_float(cf, "table_bytes", rep->table_bytes, err);
    if (!st && r->has_baseline) {
        if (!st) st = qf_payload_add_string(cf, "baseline.kv", r->baseline, err);
        if (!st) st = qf_payload_add_float(cf, "baseline.bits_per_element", r->baseline_bits, err);
        if (!st) st = qf_payload_add_float(cf, "baseline.ppl", r->baseline_ppl, err);
        if (!st) st = qf_payload_add_float(cf, "baseline.delta_ppl", r->baseline_delta_ppl, err);
        if (!st) st = qf_payload_add_float(cf, "baseline.kld_mean", r->baseline_kld_mean, err);
        if (!st) st = qf_payload_add_float(cf, "baseline.kld_p99", r->baseline_kld_p99, err);
        if (!st) st = qf_payload_add_float(cf, "baseline.top1", r->baseline_top1, err);
    }
    for (int i = 0; i < rep->n_ctx_results && !st; i++) {
        const qf_certify_result *x = &rep->ctx_results[i].result;
        char k[64];
        int n = rep->ctx_results[i].n_ctx;
#define PUTF(name, v) (snprintf(k, sizeof k, "ctx.%d." name, n), qf_payload_add_float(cf, k, (v), err))
        snprintf(k, sizeof k, "ctx.%d.passed", n);
        st = qf_payload_add_int(cf, k, x->passed, err);
        if (!st) st = PUTF("ref_ppl", x->ref_ppl);
        if (!st) st = PUTF("cand_ppl", x->cand_ppl);
        if (!st) st = PUTF("delta_ppl", x->delta_ppl);
        if (!st && isfinite(x->delta_ppl_err)) st = PUTF("delta_ppl_err", x->delta_ppl_err);
        if (!st) st = PUTF("kld_mean", x->kld_mean);
        if (!st) st = PUTF("kld_p99", x->kld_p99);
        if (!st) st = PUTF("top1", x->top1);
        if (!st && x->has_baseline) st = PUTF("baseline_kld_mean", x->baseline_kld_mean);
        if (!st && x->has_baseline) st = PUTF("baseline_kld_p99", x->baseline_kld_p99);
        if (!st && x->has_baseline) st = PUTF("baseline_delta_ppl", x->baseline_delta_ppl);
        if (!st) {
            snprintf(k, sizeof k, "ctx.%d.chunks", n);
            st = qf_payload_add_int(cf, k, x->n_chunks, err);
        }
#undef PUTF
    }
    if (!st && rep->n_ctx_results > 0) {
        char list[QF_JOB_MAX_CTX * 9 + 1] = "";
        size_t off = 0;
        for (int i = 0; i < rep->n_certified_ctx; i++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", i ? "," : "", rep->certified_ctx[i]);
        st = qf_payload_add_string(cf, "certified_ctx", list, err);
    }
    return st;
}

static qf_status fill_cert(const qf_job *j, shared *s, qf_job_report *rep, qf_error *err) {
    qf_certificate *c = &rep->cert;
    const qf_hparams *hp = qf_model_hparams(s->model);
    const qf_certify_result *r = &rep->result;
    memcpy(c->model_sha256, qf_model_sha256(s->model), 32);
    snprintf(c->model_name, sizeof c->model_name, "%s", hp->name);
    snprintf(c->model_arch, sizeof c->model_arch, "%s", hp->arch_name);
    memcpy(c->corpus_sha256, s->info->sha256, 32);
    c->corpus_docs = (int64_t)s->info->n_docs;
    c->calib_docs = (int64_t)s->info->n_calib_docs;
    c->eval_docs = (int64_t)s->info->n_eval_docs;
    snprintf(c->split, sizeof c->split, "sha256-smallest:eval_frac=%g", s->info->eval_frac);
    c->calib_tokens = s->calib_tokens;
    c->eval_tokens = r->eval_tokens;
    c->ref_ppl = r->ref_ppl;
    c->cand_ppl = r->cand_ppl;
    c->delta_ppl = r->delta_ppl;
    c->kld_mean = r->kld_mean;
    c->kld_p99 = r->kld_p99;
    c->top1_agreement = r->top1;
    /* the resolved gate the verdict used (thresholds by rate filled in) */
    const qf_gate *g = &r->gate;
    c->gate_max_delta_ppl = g->max_delta_ppl;
    c->gate_has_max_kld = g->has_max_kld;
    c->gate_max_kld = g->max_kld;
    c->gate_has_min_top1 = g->has_min_top1;
    c->gate_min_top1 = g->min_top1;
    c->passed = r->passed;
    /* config: the learner's settings, then the exact evaluation setup (to rerun it) */
    qf_payload *cf = &c->config;
    char hex[65];
    qf_hex(s->eval_sha, 32, hex);
    char inputs[512];
    snprintf(inputs, sizeof inputs, "%s", qf_corpus_inputs(s->corpus));
    qf_status st = qf_payload_add_string(cf, "variant", rep->variant, err);
    if (!st && j->kind == QF_ARTIFACT_KV_INT8) {
        if (!st) st = qf_payload_add_float(cf, "percentile", j->int8_percentile, err);
        for (int i = 0; i < rep->n_tried && !st; i++) {
            char key[64];
            snprintf(key, sizeof key, "delta_ppl.%s", rep->tried[i].variant);
            st = qf_payload_add_float(cf, key, rep->tried[i].result.delta_ppl, err);
        }
    } else if (!st && j->kind == QF_ARTIFACT_KV_DICT) {
        if (!st) st = qf_payload_add_int(cf, "iters", j->dict_iters, err);
        if (!st) st = qf_payload_add_int(cf, "max_train", j->dict_max_train, err);
        if (!st) st = qf_payload_add_int(cf, "dict_version", j->dict_version, err);
        if (!st && j->dict_version == 2) st = qf_payload_add_float(cf, "tol_quantile", j->dict_tol_quantile, err);
    } else if (!st && j->kind == QF_ARTIFACT_AWQ) {
        st = qf_payload_add_string(cf, "weights", "q4_0 (AWQ-scaled, folded)", err);
        if (!st) st = qf_payload_add_string(cf, "learn_device", rep->awq_on_gpu ? "cuda" : "cpu", err);
        if (!st && rep->n_tried > 1) { /* the RTN-Q4_0 baseline on the same evaluation tokens */
            const qf_certify_result *b = &rep->tried[1].result;
            if (!st) st = qf_payload_add_float(cf, "rtn_q4_0_ppl", b->cand_ppl, err);
            if (!st) st = qf_payload_add_float(cf, "rtn_q4_0_kld_mean", b->kld_mean, err);
            if (!st) st = qf_payload_add_float(cf, "rtn_q4_0_top1", b->top1, err);
            if (!st && isfinite(rep->awq_gap_closed))
                st = qf_payload_add_float(cf, "awq_share_of_rtn_gap_closed", rep->awq_gap_closed, err);
        }
    }
    if (!st) st = qf_payload_add_float(cf, "kv_bytes_per_token", r->cand_kv_bytes_per_token, err);
    if (!st) st = qf_payload_add_int(cf, "mpi_ranks", qf_mpi_size(), err); /* docs/mpi.md */
    if (!st) st = qf_payload_add_float(cf, "f16_kv_bytes_per_token", rep->f16_kv_bytes_per_token, err);
    if (!st) st = qf_payload_add_int(cf, "capture_per_layer", job_budgets(j).per_layer, err);
    if (!st) st = qf_payload_add_int(cf, "seed", (int64_t)j->seed, err);
    if (!st) st = qf_payload_add_string(cf, "corpus_inputs", inputs, err);
    if (!st) st = qf_payload_add_string(cf, "eval_text_sha256", hex, err);
    if (!st) st = qf_payload_add_int(cf, "eval_n_ctx", r->n_ctx, err);
    if (!st) st = qf_payload_add_int(cf, "eval_chunks", r->n_chunks, err);
    if (!st) st = qf_payload_add_string(cf, "ref_kv", qf_kv_mode_name(j->ref_kv), err);
    if (!st) st = qf_payload_add_int(cf, "n_threads", qf_context_params_get(s->ctx)->n_threads, err);
    /* "canonical": the numbers are the same bits on every device (docs/gpu.md "Canonical
     * arithmetic"); "device": this model or the candidate's cache is outside it, the numbers are
     * this device's. s->ctx holds the reference cache here; a kv-dict candidate (OMP codes) is
     * never canonical, even where its reference is */
    const bool canon = qf_context_canonical(s->ctx) && j->kind != QF_ARTIFACT_KV_DICT;
    if (!st) st = qf_payload_add_string(cf, "arith", canon ? "canonical" : "device", err);
    if (!st && j->kind == QF_ARTIFACT_KV_INT8) /* the precision the gate judged the numbers at */
        st = qf_payload_add_int(cf, "numbers_sig_digits", QF_CERT_SIG_DIGITS_INT8, err);
    if (!st && s->cert_gpu) { /* where certification ran, and the CPU re-check of its first chunk */
        st = qf_payload_add_string(cf, "certify_device", "cuda", err);
        if (!st) st = qf_payload_add_float(cf, "cpu_recheck_chunk0_ppl_gpu", s->recheck_gpu_ppl, err);
        if (!st) st = qf_payload_add_float(cf, "cpu_recheck_chunk0_ppl_cpu", s->recheck_cpu_ppl, err);
        if (!st)
            st = qf_payload_add_float(cf, "cpu_recheck_chunk0_rel_diff", fabs(s->recheck_gpu_ppl / s->recheck_cpu_ppl - 1),
                                      err);
    }
    if (!st) st = add_gate_keys(cf, rep, err);
    if (!st) {
        char cmd[768];
        snprintf(cmd, sizeof cmd,
                 "qforge ppl -m %s -f EVAL.txt -c %d --chunks %d -t %d%s "
                 "(EVAL.txt: qforge calibrate --eval-out, or qforge corpus <same inputs> -o DIR -> DIR/eval.txt; "
                 "sha256 above)",
                 j->kind == QF_ARTIFACT_AWQ ? "THE-AWQ.gguf (named by the payload)" : "MODEL --artifact ARTIFACT",
                 r->n_ctx, r->n_chunks, qf_context_params_get(s->ctx)->n_threads,
                 j->kind == QF_ARTIFACT_AWQ ? " --arith canonical" : "");
        st = qf_payload_add_string(cf, "reproduce", cmd, err);
    }
    return st;
}

static void set_variant(char *dst, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_variant(char *dst, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}


/* ---- awq ---- */

/* The AWQ learner writes a re-quantized GGUF (include/qforge/awq.h); certification runs that
 * model in its own context with the reference context's params over the same evaluation
 * tokens; a pass embeds the certificate in the GGUF and packages a .qfa naming its SHA-256;
 * a failure removes the GGUF (no artifact). */
/* Where an awq job writes its GGUF: awq_gguf_path, else OUT.qfa with .gguf for .qfa. */
static void awq_gguf_path(const qf_job *j, char *gguf, size_t cap) {
    if (j->awq_gguf_path) snprintf(gguf, cap, "%s", j->awq_gguf_path);
    else {
        size_t n = strlen(j->out_path);
        if (n > 4 && !strcmp(j->out_path + n - 4, ".qfa")) snprintf(gguf, cap, "%.*s.gguf", (int)(n - 4), j->out_path);
        else snprintf(gguf, cap, "%s.gguf", j->out_path);
    }
}

static qf_status run_awq(const qf_job *j, shared *s, qf_job_report *rep, qf_error *err) {
    char gguf[4096];
    awq_gguf_path(j, gguf, sizeof gguf);
    const qf_tokenizer *tok = qf_model_tokenizer(s->model);
    size_t clen, n = 0;
    const char *ctext = qf_corpus_calib_text(s->corpus, &clen);
    int32_t *ids = NULL;
    qf_status st = qf_tokenize(tok, ctext, clen, qf_tokenizer_add_bos(tok), false, &ids, &n, err);
    if (st) return as_stage(err, st, QF_ERR_CAPTURE_FAILED, "capture: tokenizing the calibration text");
    qf_awq_params ap = qf_awq_default_params();
    ap.n_ctx = s->n_ctx;
    ap.max_tokens = job_budgets(j).calib_tokens;
    ap.n_threads = qf_context_params_get(s->ctx)->n_threads;
    ap.progress = j->progress;
    ap.seed = j->seed;
    ap.device = j->capture_device; /* capture, search and block quantizer: the GPU when asked for or found */
    qf_awq_report arep;
    memset(&arep, 0, sizeof arep);
    double t0 = qf_now_sec();
    st = qf_awq_run(s->model, ids, (int64_t)n, &ap, gguf, &arep, err);
    free(ids);
    if (st) return as_stage(err, st, QF_ERR_CAPTURE_FAILED, "awq (capture + learn)");
    rep->seconds_learn = qf_now_sec() - t0;
    s->calib_tokens = rep->calib_tokens = arep.calib_tokens;
    rep->awq_on_gpu = arep.on_gpu;
    stage(j, "[2-3/5 capture+learn] awq over %lld calibration tokens on the %s -> %s (%.1f s: capture %.1f, search %.1f, "
             "block quantizer %.1f, write %.1f)",
          (long long)arep.calib_tokens, arep.on_gpu ? "GPU" : "CPU", gguf, rep->seconds_learn, arep.seconds_capture,
          arep.seconds_search, arep.seconds_quant, arep.seconds_write);
    qf_model *cm = NULL;
    qf_context *cc = NULL;
    qf_payload pl = {0};
    t0 = qf_now_sec();
    if ((st = stage_reference(j, s, err))) goto fail;
    if (!(cm = qf_model_load(gguf, err))) {
        st = as_stage(err, err ? err->code : QF_ERR_IO, QF_ERR_CERTIFY_FAILED, "certify: loading the AWQ model");
        goto fail;
    }
    qf_context_params cp = *qf_context_params_get(s->ctx);
    if (!(cc = qf_context_new(cm, &cp, err))) {
        st = err ? err->code : QF_ERR_NOMEM;
        goto fail;
    }
    st = qf_certify_context(cc, s->ref, &j->gate, &rep->result, err);
    rep->seconds_certify = qf_now_sec() - t0;
    if (st) goto fail;
    const qf_certify_result *r = &rep->result;
    set_variant(rep->variant, sizeof rep->variant, "q4_0-awq");
    rep->n_tried = 1;
    set_variant(rep->tried[0].variant, sizeof rep->tried[0].variant, "%s", rep->variant);
    rep->tried[0].result = *r;
    stage(j, "[4/5 certify] awq: PPL %.4f -> %.4f (delta %+.4f%%), KLD mean %.6f p99 %.6f, top-1 %.2f%%", r->ref_ppl,
          r->cand_ppl, 100 * r->delta_ppl, r->kld_mean, r->kld_p99, 100 * r->top1);
    qf_context_free(cc), cc = NULL;
    qf_model_free(cm), cm = NULL;
    /* the baseline AWQ has to beat: plain round-to-nearest Q4_0 of the same model, measured on
     * the same evaluation tokens against the same reference (reported, not gated) */
    char rtn[4200];
    snprintf(rtn, sizeof rtn, "%s.rtn.tmp", gguf);
    qf_certify_result rr;
    st = qf_quantize_model(j->model_path, rtn, QF_TYPE_Q4_0, err);
    if (!st && !(cm = qf_model_load(rtn, err))) st = err ? err->code : QF_ERR_IO;
    if (!st && !(cc = qf_context_new(cm, &cp, err))) st = err ? err->code : QF_ERR_NOMEM;
    if (!st) st = qf_certify_context(cc, s->ref, &j->gate, &rr, err);
    qf_context_free(cc), cc = NULL;
    qf_model_free(cm), cm = NULL;
    unlink(rtn);
    if (st) {
        st = as_stage(err, st, QF_ERR_CERTIFY_FAILED, "certify: the RTN-Q4_0 baseline");
        goto fail;
    }
    rep->n_tried = 2;
    set_variant(rep->tried[1].variant, sizeof rep->tried[1].variant, "q4_0-rtn");
    rep->tried[1].result = rr;
    rep->awq_gap_closed = rr.cand_ppl > r->ref_ppl ? (rr.cand_ppl - r->cand_ppl) / (rr.cand_ppl - r->ref_ppl) : NAN;
    stage(j, "[4/5 certify] rtn baseline: PPL %.4f (delta %+.4f%%), KLD mean %.6f, top-1 %.2f%%; awq closes %.1f%% of "
             "RTN's gap to the reference",
          rr.cand_ppl, 100 * rr.delta_ppl, rr.kld_mean, 100 * rr.top1, 100 * rep->awq_gap_closed);
    if ((st = fill_cert(j, s, rep, err))) goto fail;
    if (!r->passed) {
        st = qf_fail(err, QF_ERR_CERTIFY_FAILED,
                     "awq did not pass its gate: delta PPL %+.4f%% (max %.4f%%), KLD mean %.6f, top-1 %.2f%%; ref PPL "
                     "%.4f, candidate %.4f; nothing written (%s removed)",
                     100 * r->delta_ppl, 100 * j->gate.max_delta_ppl, r->kld_mean, 100 * r->top1, r->ref_ppl,
                     r->cand_ppl, gguf);
        goto fail;
    }
    t0 = qf_now_sec();
    uint8_t sha[32];
    if ((st = qf_awq_embed_certificate(gguf, &rep->cert, &arep, sha, err))) {
        st = as_stage(err, st, QF_ERR_PACKAGE_FAILED, "package: embedding the certificate in the GGUF");
        goto fail;
    }
    const char *base = strrchr(gguf, '/');
    base = base ? base + 1 : gguf;
    int64_t shape[1] = {32};
    if ((st = qf_payload_add_u8(&pl, "gguf_sha256", sha, 1, shape, err)) ||
        (st = qf_payload_add_string(&pl, "gguf_file", base, err)) ||
        (st = qf_artifact_package(j->out_path, &rep->cert, &pl, j->sign_key_path, err))) {
        st = as_stage(err, st, QF_ERR_PACKAGE_FAILED, "package");
        goto fail;
    }
    rep->seconds_package = qf_now_sec() - t0;
    rep->packaged = true;
    stage(j, "[5/5 package] %s (awq, names %s)", j->out_path, gguf);
    qf_payload_free(&pl);
    qf_awq_report_free(&arep);
    return QF_OK;
fail:
    qf_payload_free(&pl);
    qf_context_free(cc);
    qf_model_free(cm);
    qf_awq_report_free(&arep);
    unlink(gguf); /* fail closed: no uncertified model is left behind */
    return st;
}

/* ---- kv-rq ---- */

static qf_status certify_at_ctx(const qf_job *j, shared *s, int n, const qf_payload *pl, qf_certify_result *r,
                                qf_error *err);


/* ---- kv-rq channel importance (query-aware K, output-aware V) ---- */

typedef struct {
    const qf_hparams *hp;
    double *q_sq; /* [L][n_head][D] sums of squared queries */
    int64_t *n;   /* [L] tokens */
} rq_qstats;

static void rq_on_q(void *user, int layer, int pos0, int n_tok, int n_head, int head_dim, const float *q) {
    (void)pos0;
    rq_qstats *qs = user;
    if (layer < 0 || layer >= qs->hp->n_layer || n_head != qs->hp->n_head || head_dim != qs->hp->head_dim) return;
    size_t row = (size_t)n_head * head_dim;
    double *acc = qs->q_sq + (size_t)layer * row;
    for (int t = 0; t < n_tok; t++)
        for (size_t i = 0; i < row; i++) acc[i] += (double)q[t * row + i] * q[t * row + i];
    qs->n[layer] += n_tok;
}

/* The importance of each K and V channel's error for kv-rq's channel scales, [L][H][D] each:
 * kw = the mean squared query over the heads that read the kv head (post-RoPE queries over up
 * to 4 windows of min(N, 512) calibration tokens, averaged over each RoPE pair so that it does
 * not depend on the position), vw = the squared norms of the attn_output columns the channel
 * feeds (summed over the heads of the group). Calibration text only. */
static qf_status rq_channel_weights(const qf_job *j, shared *s, float *kw, float *vw, qf_error *err) {
    const qf_hparams *hp = qf_model_hparams(s->model);
    int L = hp->n_layer, H = hp->n_head_kv, NH = hp->n_head, D = hp->head_dim, gq = NH / H;
    size_t nq = (size_t)L * NH * D;
    rq_qstats qs = {.hp = hp, .q_sq = calloc(nq, sizeof(double)), .n = calloc((size_t)L, sizeof(int64_t))};
    float *wo = NULL;
    int32_t *ids = NULL;
    qf_status st = QF_OK;
    if (!qs.q_sq || !qs.n) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv-rq channel weights: out of memory");
        goto done;
    }
    const qf_tokenizer *tok = qf_model_tokenizer(s->model);
    size_t clen, n = 0;
    const char *ctext = qf_corpus_calib_text(s->corpus, &clen);
    if ((st = qf_tokenize(tok, ctext, clen, qf_tokenizer_add_bos(tok), false, &ids, &n, err))) goto done;
    const qf_context_params *cp = qf_context_params_get(s->ctx);
    int W = s->n_ctx < 512 ? s->n_ctx : 512;
    qf_tap tap = {.user = &qs, .on_q = rq_on_q};
    qf_context_set_tap(s->ctx, &tap);
    bool add_bos = qf_tokenizer_add_bos(tok) && qf_tokenizer_bos(tok) >= 0;
    for (int w = 0; w < 4 && !st && (size_t)(w + 1) * W <= n; w++) {
        int32_t *win = ids + (size_t)w * W;
        if (add_bos) win[0] = qf_tokenizer_bos(tok);
        for (int t = 0; t < W && !st; t += cp->n_batch) {
            int bs = W - t < cp->n_batch ? W - t : cp->n_batch;
            st = qf_decode(s->ctx, win + t, bs, t, NULL, bs, err);
        }
    }
    qf_context_set_tap(s->ctx, NULL);
    if (st) goto done;
    (void)j;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int c = 0; c < D; c++) {
                double a = 0;
                for (int g = 0; g < gq; g++) a += qs.q_sq[((size_t)l * NH + h * gq + g) * D + c];
                kw[((size_t)l * H + h) * D + c] = (float)(qs.n[l] > 0 ? a / (double)qs.n[l] : 1.0);
            }
    /* average over each RoPE pair (adjacent for NORM, halves for NEOX) */
    int half = hp->n_rot / 2;
    for (size_t lh = 0; lh < (size_t)L * H; lh++)
        for (int i = 0; i < half; i++) {
            int a = hp->rope_type == QF_ROPE_NEOX ? i : 2 * i, b = hp->rope_type == QF_ROPE_NEOX ? i + half : 2 * i + 1;
            float m = 0.5f * (kw[lh * D + a] + kw[lh * D + b]);
            kw[lh * D + a] = kw[lh * D + b] = m;
        }
    /* V: squared attn_output column norms */
    for (int l = 0; l < L && !st; l++) {
        const qf_weight *w = &qf_model_layer(s->model, l)->wo;
        int64_t in = w->ne0, rows = w->ne1 > 0 ? w->ne1 : 1;
        if (in != (int64_t)NH * D) {
            st = qf_fail(err, QF_ERR_UNSUPPORTED, "kv-rq channel weights: layer %d attn_output has %lld inputs, expected %d",
                         l, (long long)in, NH * D);
            break;
        }
        float *nw = realloc(wo, (size_t)in * sizeof(float));
        if (!nw) {
            st = qf_fail(err, QF_ERR_NOMEM, "kv-rq channel weights: out of memory");
            break;
        }
        wo = nw;
        double *col = calloc((size_t)in, sizeof(double));
        if (!col) {
            st = qf_fail(err, QF_ERR_NOMEM, "kv-rq channel weights: out of memory");
            break;
        }
        for (int64_t r = 0; r < rows; r++) {
            qf_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, wo, in);
            for (int64_t i = 0; i < in; i++) col[i] += (double)wo[i] * wo[i];
        }
        for (int h = 0; h < H; h++)
            for (int c = 0; c < D; c++) {
                double a = 0;
                for (int g = 0; g < gq; g++) a += col[(size_t)(h * gq + g) * D + c];
                vw[((size_t)l * H + h) * D + c] = (float)a;
            }
        free(col);
    }
done:
    free(ids), free(wo), free(qs.q_sq), free(qs.n);
    return st;
}

/* V Gram matrices for the format-3 metric, vg [L][H][D][D]: G = sum over the heads g of the kv
 * head's group of Wo_g^T Wo_g (Wo_g the attn_output columns of head g): the output error of a V
 * error e is |Wo_g e|^2 = e^T G e (summed over the heads that read it). Each entry is one double
 * sum over the rows, then the group's heads, in that order; G is symmetric and c[a] c[b] is
 * c[b] c[a] exactly, so only a <= b is summed and mirrored, and the layers go over a pool of
 * n_threads (the same bits for any count). */
typedef struct {
    shared *s;
    float *vg;
    int n_layer;
    atomic_int next;
    qf_status *st; /* [L] */
    qf_error *err; /* [L] */
} v_gram_job;

static qf_status v_gram_layer(shared *s, int l, float *vg, qf_error *err) {
    const qf_hparams *hp = qf_model_hparams(s->model);
    int H = hp->n_head_kv, NH = hp->n_head, D = hp->head_dim, gq = NH / H;
    const qf_weight *w = &qf_model_layer(s->model, l)->wo;
    int64_t in = w->ne0, rows = w->ne1 > 0 ? w->ne1 : 1;
    if (in != (int64_t)NH * D)
        return qf_fail(err, QF_ERR_UNSUPPORTED, "kv-rq klt: layer %d attn_output has %lld inputs, expected %d", l,
                       (long long)in, NH * D);
    float *wo = malloc((size_t)in * sizeof(float));
    double *g = calloc((size_t)H * D * D, sizeof(double));
    if (!wo || !g) {
        free(wo), free(g);
        return qf_fail(err, QF_ERR_NOMEM, "kv-rq klt: out of memory");
    }
    for (int64_t r = 0; r < rows; r++) {
        qf_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, wo, in);
        for (int h = 0; h < H; h++)
            for (int gg = 0; gg < gq; gg++) {
                const float *c = wo + (size_t)(h * gq + gg) * D;
                double *gh = g + (size_t)h * D * D;
                for (int a = 0; a < D; a++) {
                    const double ca = c[a];
                    double *ga = gh + (size_t)a * D;
                    for (int b = a; b < D; b++) ga[b] += ca * c[b];
                }
            }
    }
    for (int h = 0; h < H; h++)
        for (int a = 0; a < D; a++)
            for (int b = a; b < D; b++) {
                const size_t o = (size_t)l * H * D * D + (size_t)h * D * D;
                vg[o + (size_t)a * D + b] = vg[o + (size_t)b * D + a] = (float)g[(size_t)h * D * D + (size_t)a * D + b];
            }
    free(wo), free(g);
    return QF_OK;
}

static void v_gram_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    v_gram_job *j = arg;
    for (int l; (l = atomic_fetch_add(&j->next, 1)) < j->n_layer;) j->st[l] = v_gram_layer(j->s, l, j->vg, &j->err[l]);
}

static qf_status rq_v_gram(shared *s, int n_threads, float *vg, qf_error *err) {
    int L = qf_model_hparams(s->model)->n_layer;
    qf_pool *pool = n_threads > 1 ? qf_pool_create(n_threads < L ? n_threads : L) : NULL;
    v_gram_job j = {.s = s, .vg = vg, .n_layer = L, .st = calloc((size_t)L, sizeof(qf_status)),
                    .err = calloc((size_t)L, sizeof(qf_error))};
    atomic_init(&j.next, 0);
    qf_status st = QF_OK;
    if ((n_threads > 1 && L > 1 && !pool) || !j.st || !j.err) st = qf_fail(err, QF_ERR_NOMEM, "kv-rq klt: out of memory");
    else {
        qf_pool_run(pool, v_gram_worker, &j);
        for (int l = 0; l < L && !st; l++) /* the first failing layer */
            if (j.st[l]) {
                st = j.st[l];
                if (err) *err = j.err[l];
            }
    }
    qf_pool_free(pool);
    free(j.st), free(j.err);
    return st;
}

/* Format 3 on top of the learned fit: the metric (unless --rq-klt-metric plain), the KLT fit,
 * and the measurement behind it logged per (layer, stream): the eigenvalue spread (arithmetic /
 * geometric mean, the transform-coding gain over equal widths, in dB), the share of the
 * variance in the top eighth of the coordinates, and both codecs' relative error in the metric. */
static qf_status rq_learn_klt(const qf_job *j, shared *s, const qf_kv_capture_view *v, qf_kv_rq_fit *fit,
                              qf_error *err) {
    const qf_hparams *hp = qf_model_hparams(s->model);
    int L = hp->n_layer, H = hp->n_head_kv, D = hp->head_dim;
    size_t n = (size_t)L * H * D;
    float *kw = NULL, *vw = NULL, *vg = NULL;
    qf_status st = QF_OK;
    double t0 = qf_now_sec();
    if (!j->rq_klt_plain) {
        if (!(kw = malloc(n * sizeof(float))) || !(vw = malloc(n * sizeof(float))) || !(vg = malloc(n * D * sizeof(float))))
            st = qf_fail(err, QF_ERR_NOMEM, "kv-rq klt: out of memory");
        if (!st) st = rq_channel_weights(j, s, kw, vw, err);
        if (!st) st = rq_v_gram(s, qf_context_params_get(s->ctx)->n_threads, vg, err);
    }
    qf_kv_rq_learn_params kp;
    qf_kv_rq_learn_params_default(&kp);
    kp.max_rows = 4096, kp.n_threads = qf_context_params_get(s->ctx)->n_threads, kp.gpu = may_use_gpu(j);
    double t1 = qf_now_sec();
    if (!st) st = qf_kv_rq_learn_klt(v, kw, vg, &kp, fit, err);
    free(kw), free(vw), free(vg);
    if (st) return st;
    fit->klt->eighths = j->rq_klt_eighths == 1;
    for (int l = 0; l < L; l++)
        for (int sidx = 0; sidx < 2; sidx++) {
            double gain = 0, top = 0;
            for (int h = 0; h < H; h++) {
                const double *e = fit->klt->eig[sidx] + ((size_t)l * H + h) * D;
                double am = 0, lg = 0, tt = 0;
                for (int i = 0; i < D; i++) am += e[i], lg += log(e[i]), tt += i < D / 8 ? e[i] : 0;
                am /= D;
                gain += 10 * log10(am / exp(lg / D)) / H, top += tt / (am * D) / H;
            }
            const double *rk = fit->rel_mse[sidx] + l * QF_KV_RQ_N_WIDTHS, *rh = fit->klt->had_rel_mse[sidx] + l * QF_KV_RQ_N_WIDTHS;
            stage(j, "[3/5 learn] kv-rq klt layer %d %c: eigenvalue AM/GM %.1f dB, top %d of %d coordinates %.1f%% of the "
                     "variance; relative error in the metric klt / hadamard at 1 / 2 / 3 / 4 bits: %.4f/%.4f %.4f/%.4f "
                     "%.4f/%.4f %.4f/%.4f",
                  l, sidx ? 'V' : 'K', gain, D / 8, D, 100 * top, rk[0], rh[0], rk[1], rh[1], rk[2], rh[2], rk[3], rh[3]);
        }
    stage(j, "[3/5 learn] kv-rq klt (metric %s) in %.1f s (the metric's weights %.1f s, the fits %.1f s%s)",
          j->rq_klt_plain ? "plain" : "attention", qf_now_sec() - t0, t1 - t0, qf_now_sec() - t1,
          kp.gpu ? ", V residual on the GPU" : "");
    return QF_OK;
}

/* A (layer, stream) allocation as text: one digit per layer for whole bits, "1.625/0.5/..." when
 * any layer has a fractional format-3 rate (engine/kv_rq_klt.h) */
static void rq_bits_str(const int *b, int L, char *out, size_t n) {
    bool frac = false;
    for (int l = 0; l < L; l++) frac |= b[l] > QF_KV_RQ_KLT_EIGHTHS_BASE;
    size_t o = 0;
    out[0] = 0;
    for (int l = 0; l < L && o + 8 < n; l++) {
        if (!frac) out[o++] = (char)('0' + b[l] % 10), out[o] = 0;
        else o += (size_t)snprintf(out + o, n - o, "%s%g", l ? "/" : "", qf_kv_rq_klt_eighths(b[l]) / 8.0);
    }
}

/* pl for the allocation bits and S sinks + R window tokens of fit: built on the first call (pl
 * empty), afterwards only the entries the allocation changes are rewritten
 * (qf_kv_rq_payload_update), so the sensitivity and window loops do not copy the fit's
 * matrices (the V predictor: 128 MB at 8B) once per pass. The certified candidate's payload is
 * still built whole (rq_certify). */
static qf_status rq_payload_for(const qf_kv_rq_fit *fit, int *const bits[2], int S, int R, qf_payload *pl,
                                qf_error *err) {
    if (pl->n) return qf_kv_rq_payload_update(fit, (const int *const *)bits, S, R, pl, err);
    return qf_kv_rq_payload(fit, (const int *const *)bits, S, R, pl, err);
}

/* One kv-rq candidate certified on the evaluation split (s->ref) and logged. */
static qf_status rq_certify(const qf_job *j, shared *s, const qf_kv_rq_fit *fit, int *const bits[2], int S, int R,
                            qf_payload *pl, qf_certify_result *r, double *bpe, qf_error *err) {
    qf_payload_free(pl);
    memset(pl, 0, sizeof *pl);
    qf_status st = qf_kv_rq_payload(fit, (const int *const *)bits, S, R, pl, err);
    if (st) return st;
    *bpe = qf_kv_rq_bits_per_element((const int *const *)bits, fit->n_layer, fit->head_dim, S, R, s->n_ctx);
    if ((st = qf_certify_candidate(s->ctx, s->ref, QF_ARTIFACT_KV_RQ, pl, &j->gate, r, err))) return st;
    char kb[256], vb[256];
    rq_bits_str(bits[0], fit->n_layer, kb, sizeof kb), rq_bits_str(bits[1], fit->n_layer, vb, sizeof vb);
    stage(j, "[4/5 certify] kv-rq K %s V %s S%d R%d: %.3f bits/element, PPL %.4f -> %.4f (delta %+.4f%%), KLD mean "
             "%.6f p99 %.6f, top-1 %.2f%% -> %s",
          kb, vb, S, R, *bpe, r->ref_ppl, r->cand_ppl, 100 * r->delta_ppl, r->kld_mean, r->kld_p99, 100 * r->top1,
          r->passed ? "passes" : "fails");
    return QF_OK;
}

/* The kv-rq sensitivity text: n_chunks chunks of n_ctx tokens spread evenly over the whole
 * calibration text (chunk k starts at token floor(k * T / n_chunks) * n_ctx of its T whole
 * chunks), decoded back to bytes and concatenated, so that the sensitivity and the window split
 * see every part of the split (the first chunks alone can all be one kind of document: on the
 * 27m model's calibration split the Japanese documents that make layer 0's V the most sensitive
 * unit start at token 24k). *out = NULL (use the text as it is) when it holds no more than
 * n_chunks chunks. */
static qf_status rq_spread_text(const qf_model *m, const char *text, size_t len, int n_ctx, int n_chunks, char **out,
                                size_t *out_len, qf_error *err) {
    const qf_tokenizer *tok = qf_model_tokenizer(m);
    int32_t *ids = NULL;
    size_t n = 0;
    *out = NULL, *out_len = 0;
    qf_status st = qf_tokenize(tok, text, len, false, false, &ids, &n, err);
    if (st) return st;
    size_t total = n_ctx > 0 ? n / (size_t)n_ctx : 0;
    if (n_chunks < 1 || total <= (size_t)n_chunks) {
        free(ids);
        return QF_OK;
    }
    size_t cap = (size_t)n_chunks * n_ctx * 16 + 64, o = 0;
    char *buf = malloc(cap);
    if (!buf) {
        free(ids);
        return qf_fail(err, QF_ERR_NOMEM, "kv-rq sensitivity text: out of memory");
    }
    for (int k = 0; k < n_chunks; k++) {
        size_t at = (size_t)((double)k * (double)total / n_chunks) * (size_t)n_ctx;
        for (size_t i = at; i < at + (size_t)n_ctx; i++) {
            int w = qf_token_to_piece(tok, ids[i], false, buf + o, cap - o);
            if (w < 0) continue;
            if ((size_t)w > cap - o) { /* grow and decode this token again */
                char *nb = realloc(buf, cap * 2 + (size_t)w);
                if (!nb) {
                    free(buf), free(ids);
                    return qf_fail(err, QF_ERR_NOMEM, "kv-rq sensitivity text: out of memory");
                }
                buf = nb, cap = cap * 2 + (size_t)w;
                w = qf_token_to_piece(tok, ids[i], false, buf + o, cap - o);
            }
            o += (size_t)w;
        }
    }
    free(ids);
    *out = buf, *out_len = o;
    return QF_OK;
}

/* kv-rq: learn (means, channel scales, codebooks), measure each (layer, stream)'s sensitivity
 * alone at 2 bits as mean KLD on calibration text (never the evaluation split), allocate bits
 * greedily, certify: with a budget (--bits) the best allocation within it, else the fewest
 * bits (binary search along the greedy path) that pass the gate. */
static qf_status run_rq(const qf_job *j, shared *s, qf_job_report *rep, qf_error *err) {
    const qf_hparams *hp = qf_model_hparams(s->model);
    int L = hp->n_layer, D = hp->head_dim, U = 2 * L;
    qf_kv_rq_fit fit;
    qf_kv_rq_learn_params lp;
    qf_kv_rq_learn_params_default(&lp);
    lp.k_alpha = j->rq_k_alpha;
    lp.seed = j->seed;
    qf_kv_capture_view v = qf_capture_kv_view(s->cap);
    double t0 = qf_now_sec();
    float *cw[2] = {NULL, NULL};
    qf_status st = QF_OK;
    if (j->rq_qaware) {
        size_t ncw = (size_t)L * hp->n_head_kv * D;
        if (!(cw[0] = malloc(ncw * sizeof(float))) || !(cw[1] = malloc(ncw * sizeof(float))))
            st = qf_fail(err, QF_ERR_NOMEM, "kv-rq: out of memory");
        if (!st) st = rq_channel_weights(j, s, cw[0], cw[1], err);
        if (st) {
            free(cw[0]), free(cw[1]);
            return as_stage(err, st, st == QF_ERR_NOMEM ? st : QF_ERR_CAPTURE_FAILED, "kv-rq channel weights");
        }
        lp.chan_w[0] = cw[0], lp.chan_w[1] = cw[1];
        lp.v_alpha = j->rq_v_alpha;
    }
    lp.v_pred = j->rq_vpred != 0 && rq_use_prerope(j);
    lp.v_pred_noise = j->rq_vpred_noise;
    lp.n_threads = qf_context_params_get(s->ctx)->n_threads;
    lp.gpu = may_use_gpu(j);
    st = qf_kv_rq_learn(&v, &lp, &fit, err);
    free(cw[0]), free(cw[1]);
    if (!st && fit.v_pred) {
        char line[512];
        int o = 0;
        for (int l = 0; l < L && o < 400; l++) o += snprintf(line + o, sizeof line - (size_t)o, " %.3f", fit.v_pred_ratio[l]);
        stage(j, "[3/5 learn] kv-rq V predicted from the same layer's K: residual / V variance per layer%s", line);
    }
    if (!st && rq_use_klt(j)) st = rq_learn_klt(j, s, &v, &fit, err); /* format 3 */
    if (st) return as_stage(err, st, st == QF_ERR_NOMEM ? st : QF_ERR_CAPTURE_FAILED, "learn");
    fit.k_prerope = rq_use_prerope(j); /* stage_capture kept K before RoPE */
    /* the allocation's floor: 1-bit rows for the least sensitive units at low budgets */
    int mb = j->rq_min_bits ? j->rq_min_bits : j->rq_bits > 0 && j->rq_bits <= RQ_LOW_BUDGET_BITS ? 1 : QF_KV_RQ_SENS_BITS;
    double mse[QF_KV_RQ_N_WIDTHS] = {0};
    for (int sidx = 0; sidx < 2; sidx++)
        for (int l = 0; l < L; l++)
            for (int w = 0; w < QF_KV_RQ_N_WIDTHS; w++) mse[w] += fit.rel_mse[sidx][l * QF_KV_RQ_N_WIDTHS + w] / U;
    stage(j, "[3/5 learn] kv-rq codebooks in %.1f s (K %s RoPE): relative MSE %.4f / %.4f / %.4f / %.4f at 1 / 2 / 3 / 4 bits",
          qf_now_sec() - t0, fit.k_prerope ? "before" : "after", mse[1 - QF_KV_RQ_MIN_BITS], mse[2 - QF_KV_RQ_MIN_BITS],
          mse[3 - QF_KV_RQ_MIN_BITS], mse[4 - QF_KV_RQ_MIN_BITS]);
    /* sinks and window (docs/kv-rq.md has the measurement behind this): 4 sinks, and f16
     * tokens worth up to 0.75 bits per element at -c N (24 tokens at 512), or less when a
     * budget leaves less room above 2-bit codes and row scales */
    double scale_bits = 8.0 * QF_KV_RQ_SCALE_BYTES / D, win_bits = 0.75;
    if (j->rq_bits > 0 && j->rq_bits - mb - scale_bits < win_bits)
        win_bits = j->rq_bits - mb - scale_bits;
    int SR = win_bits > 0 ? (int)floor(win_bits * s->n_ctx / 16.0 + 1e-9) : 0;
    int S = j->rq_sink >= 0 ? j->rq_sink : SR < 4 ? SR : 4;
    int R = j->rq_window >= 0 ? j->rq_window : SR - S > 0 ? SR - S : 0;
    if (S + R >= s->n_ctx) S = S < s->n_ctx / 4 ? S : s->n_ctx / 4, R = R < s->n_ctx / 4 ? R : s->n_ctx / 4;
    if (j->rq_bits > 0 && j->rq_bits - scale_bits - 16.0 * (S + R) / s->n_ctx < mb) {
        qf_kv_rq_fit_free(&fit);
        return qf_fail(err, QF_ERR_ARG,
                       "kv-rq: a budget of %.3f bits per element leaves %.3f for codes at -c %d (row scales %.3f, %d "
                       "sinks + %d window tokens %.3f): at least %d are needed%s; lower --sinks/--window or raise --bits",
                       j->rq_bits, j->rq_bits - scale_bits - 16.0 * (S + R) / s->n_ctx, s->n_ctx, scale_bits, S, R,
                       16.0 * (S + R) / s->n_ctx, mb, j->rq_min_bits ? " (--rq-min-bits does not fit)" : "");
    }
    /* sensitivity on calibration text */
    int *bits[2] = {malloc(sizeof(int) * (size_t)L), malloc(sizeof(int) * (size_t)L)};
    double *sens[2] = {calloc((size_t)L, sizeof(double)), calloc((size_t)L, sizeof(double))};
    qf_certify_ref *cref = NULL;
    qf_payload pl = {0}, best = {0};
    if (!bits[0] || !bits[1] || !sens[0] || !sens[1]) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv-rq: out of memory");
        goto done;
    }
    t0 = qf_now_sec();
    size_t clen;
    const char *ctext = qf_corpus_calib_text(s->corpus, &clen);
    /* chunks of min(N, 512) tokens by default (cheap); --sens-ctx N measures at the context the
     * artifact is certified for, where the window covers a realistic share of every chunk */
    int sens_ctx = j->rq_sens_ctx > 0 ? j->rq_sens_ctx : s->n_ctx < 512 ? s->n_ctx : 512;
    int sens_chunks = j->rq_sens_chunks > 0 ? j->rq_sens_chunks : fit.klt ? 4 : 2;
    qf_certify_params cp = {.n_ctx = sens_ctx, .n_chunks = sens_chunks > 2 ? sens_chunks : 2};
    char *stext = NULL;
    size_t slen = 0;
    if ((st = rq_spread_text(s->model, ctext, clen, sens_ctx, cp.n_chunks, &stext, &slen, err))) {
        st = as_stage(err, st, st == QF_ERR_NOMEM ? st : QF_ERR_CAPTURE_FAILED, "kv-rq sensitivity text");
        goto done;
    }
    st = qf_certify_reference(s->ctx, stext ? stext : ctext, stext ? slen : clen, &cp, &cref, err);
    free(stext);
    if (st) {
        st = as_stage(err, st, QF_ERR_CAPTURE_FAILED, "kv-rq sensitivity: reference on the calibration text");
        goto done;
    }
    qf_gate any = qf_gate_default();
    any.max_delta_ppl = 1e30;
    double t_pass = 0; /* the passes themselves, without building and binding the payloads */
    for (int u = 0; u < U; u++) {
        for (int sidx = 0; sidx < 2; sidx++)
            for (int l = 0; l < L; l++) bits[sidx][l] = QF_KV_RQ_BITS_F16;
        bits[u % 2][u / 2] = QF_KV_RQ_SENS_BITS;
        qf_certify_result r;
        if ((st = rq_payload_for(&fit, bits, S, R, &pl, err)) ||
            (st = qf_certify_candidate(s->ctx, cref, QF_ARTIFACT_KV_RQ, &pl, &any, &r, err)))
            goto done;
        sens[u % 2][u / 2] = r.kld_mean > 1e-9 ? r.kld_mean : 1e-9;
        t_pass += r.seconds;
    }
    {
        char line[1024];
        int o = 0;
        for (int l = 0; l < L && o < 900; l++) o += snprintf(line + o, sizeof line - (size_t)o, " %d:%.4f/%.4f", l, sens[0][l], sens[1][l]);
        stage(j, "[3/5 learn] kv-rq sensitivity (mean KLD at 2 bits alone, K/V per layer, %d calibration chunks of %d, "
                 "%.1f s, the passes %.1f s):%s",
              cp.n_chunks, cp.n_ctx, qf_now_sec() - t0, t_pass, line);
    }
    rep->seconds_learn = qf_now_sec() - t0;
    t0 = qf_now_sec();
    if ((st = stage_reference(j, s, err))) goto done;
    double overhead = 8.0 * QF_KV_RQ_SCALE_BYTES / D + 16.0 * (S + R) / s->n_ctx; /* row scale + sinks and window */
    qf_certify_result r;
    double bpe = NAN;
    if (j->rq_bits > 0) {
        double max_code = j->rq_bits - overhead;
        if (max_code < mb) {
            st = qf_fail(err, QF_ERR_ARG,
                         "kv-rq: a budget of %.3f bits per element leaves %.3f for codes at -c %d (row scales %.3f, %d "
                         "sinks + %d window tokens %.3f): at least %d are needed; lower --sinks/--window or raise --bits",
                         j->rq_bits, max_code, s->n_ctx, 8.0 * QF_KV_RQ_SCALE_BYTES / D, S, R, 16.0 * (S + R) / s->n_ctx, mb);
            goto done;
        }
        double pred = qf_kv_rq_allocate_min(&fit, (const double *const *)sens, max_code, mb, bits);
        stage(j, "[3/5 learn] kv-rq allocation within %.3f bits (codes <= %.3f): predicted KLD %.5f", j->rq_bits, max_code,
              pred);
        if (j->rq_sink < 0 && j->rq_window < 0) {
            /* the window competes with the codes for the budget: measure a few splits on the
             * calibration text (mean KLD of the whole allocation) and keep the best */
            static const double levels[] = {1.0, 0.875, 0.75, 0.5, 0.375, 0.25, 0.125, 0.0625, 0};
            double best_kld = INFINITY;
            int bS = S, bR = R, tried_s[32], tried_r[32], n_tried = 0;
            /* windows above 0.75 bits only where 1-bit rows leave room for them */
            for (size_t li = mb < QF_KV_RQ_SENS_BITS ? 0 : 4; li < 2 * (sizeof levels / sizeof levels[0]); li++) {
                int max_sinks = li % 2 ? 4 : 1; /* BOS alone, or StreamingLLM's 4 */
                double wb = levels[li / 2] < j->rq_bits - mb - scale_bits
                                ? levels[li / 2]
                                : j->rq_bits - mb - scale_bits;
                int sr = wb > 0 ? (int)floor(wb * s->n_ctx / 16.0 + 1e-9) : 0;
                if (sr >= s->n_ctx / 2) continue;
                int cs = sr < max_sinks ? sr : max_sinks, cr = sr - cs;
                bool seen = false;
                for (int t = 0; t < n_tried; t++) seen |= tried_s[t] == cs && tried_r[t] == cr;
                if (seen || n_tried >= 32) continue;
                tried_s[n_tried] = cs, tried_r[n_tried++] = cr;
                double mc = j->rq_bits - scale_bits - 16.0 * sr / s->n_ctx;
                if (mc < mb) continue;
                qf_kv_rq_allocate_min(&fit, (const double *const *)sens, mc, mb, bits);
                qf_certify_result cr_;
                if ((st = rq_payload_for(&fit, bits, cs, cr, &pl, err)) ||
                    (st = qf_certify_candidate(s->ctx, cref, QF_ARTIFACT_KV_RQ, &pl, &any, &cr_, err)))
                    goto done;
                stage(j, "[3/5 learn] kv-rq split S%d R%d (codes <= %.3f): calibration KLD %.5f", cs, cr, mc, cr_.kld_mean);
                if (cr_.kld_mean < best_kld) best_kld = cr_.kld_mean, bS = cs, bR = cr;
            }
            S = bS, R = bR;
            max_code = j->rq_bits - scale_bits - 16.0 * (S + R) / s->n_ctx;
            qf_kv_rq_allocate_min(&fit, (const double *const *)sens, max_code, mb, bits);
        }
        if (max_code < mb - 1e-9) {
            st = qf_fail(err, QF_ERR_ARG,
                         "kv-rq: --rq-min-bits %d does not fit a budget of %.3f bits per element at -c %d (codes <= %.3f "
                         "after row scales and %d sinks + %d window tokens); lower --rq-min-bits or raise --bits",
                         mb, j->rq_bits, s->n_ctx, max_code, S, R);
            goto done;
        }
        if ((st = rq_certify(j, s, &fit, bits, S, R, &pl, &r, &bpe, err))) goto done;
        rep->result = r;
        rep->bits_per_element = bpe;
        qf_payload tmp = best;
        best = pl, pl = tmp;
    } else {
        /* binary search over k = upgrades along the greedy path (k = 0: all 2 bits, 2U: all 4) */
        int lo = 0, hi = U * (QF_KV_RQ_MAX_BITS - mb), found = -1;
        while (lo <= hi) {
            int k = (lo + hi) / 2;
            qf_kv_rq_allocate_min(&fit, (const double *const *)sens, mb + (double)k / U, mb, bits);
            if ((st = rq_certify(j, s, &fit, bits, S, R, &pl, &r, &bpe, err))) goto done;
            if (rep->n_tried < QF_JOB_MAX_TRIED) {
                set_variant(rep->tried[rep->n_tried].variant, sizeof rep->tried[0].variant, "%.3f-bits", bpe);
                rep->tried[rep->n_tried++].result = r;
            }
            if (r.passed || found < 0) { /* keep the passing one (or, until one passes, the last) */
                if (r.passed) found = k;
                rep->result = r;
                rep->bits_per_element = bpe;
                qf_payload tmp = best;
                best = pl, pl = tmp;
            }
            if (r.passed) hi = k - 1;
            else lo = k + 1;
        }
        if (found >= 0) { /* re-derive the passing allocation's bits for the variant name */
            qf_kv_rq_allocate_min(&fit, (const double *const *)sens, mb + (double)found / U, mb, bits);
        }
    }
    double bpe_first = rep->bits_per_element;
    set_variant(rep->variant, sizeof rep->variant, "%.3f-bits-S%d-R%d", rep->bits_per_element, S, R);
    if (j->rq_bits > 0) {
        rep->n_tried = 1;
        set_variant(rep->tried[0].variant, sizeof rep->tried[0].variant, "%s", rep->variant);
        rep->tried[0].result = rep->result;
    }
    /* the chosen payload at every other context of the --ctx list (the budget held at the first) */
    rep->n_ctx_results = 1;
    rep->ctx_results[0].n_ctx = s->n_ctx;
    rep->ctx_results[0].result = rep->result;
    for (int ci = 1; ci < j->n_ctx_list && ci < QF_JOB_MAX_CTX; ci++) {
        qf_certify_result rc;
        if ((st = certify_at_ctx(j, s, j->ctx_list[ci], &best, &rc, err))) goto done;
        rep->ctx_results[rep->n_ctx_results].n_ctx = j->ctx_list[ci];
        rep->ctx_results[rep->n_ctx_results++].result = rc;
    }
    for (int ci = 0; ci < rep->n_ctx_results; ci++)
        if (rep->ctx_results[ci].result.passed) rep->certified_ctx[rep->n_certified_ctx++] = rep->ctx_results[ci].n_ctx;
    report_rate(rep, QF_ARTIFACT_KV_RQ, &best, hp, s->n_ctx);
    rep->seconds_certify = qf_now_sec() - t0;
    if ((st = fill_cert(j, s, rep, err))) goto done;
    qf_payload *cf = &rep->cert.config;
    char kb[256] = "", vb[256] = "";
    {
        size_t nb;
        const uint8_t *b0 = qf_payload_get_bytes(&best, "k_bits", &nb), *b1 = qf_payload_get_bytes(&best, "v_bits", &nb);
        if (b0 && b1 && L <= 120) {
            int i0[120], i1[120];
            for (int l = 0; l < L; l++) i0[l] = b0[l], i1[l] = b1[l];
            rq_bits_str(i0, L, kb, sizeof kb), rq_bits_str(i1, L, vb, sizeof vb);
        }
    }
    if ((st = qf_payload_add_float(cf, "bits_per_element_at_first_ctx", bpe_first, err)) ||
        (st = qf_payload_add_int(cf, "n_sink", S, err)) || (st = qf_payload_add_int(cf, "n_window", R, err)) ||
        (st = qf_payload_add_string(cf, "k_bits", kb, err)) || (st = qf_payload_add_string(cf, "v_bits", vb, err)) ||
        (st = qf_payload_add_float(cf, "k_alpha", j->rq_k_alpha, err)) ||
        (st = qf_payload_add_int(cf, "k_prerope", fit.k_prerope, err)) || (st = qf_payload_add_int(cf, "min_bits", mb, err)) ||
        (st = qf_payload_add_int(cf, "channel_weights", j->rq_qaware, err)) ||
        (st = qf_payload_add_int(cf, "v_pred", fit.v_pred != NULL, err)) ||
        (j->rq_qaware && (st = qf_payload_add_float(cf, "v_alpha", j->rq_v_alpha, err))) ||
        (j->rq_bits > 0 && (st = qf_payload_add_float(cf, "budget_bits", j->rq_bits, err))) ||
        (st = qf_payload_add_int(cf, "sens_ctx", sens_ctx, err)) ||
        (st = qf_payload_add_string(cf, "transform", fit.klt ? (j->rq_klt_plain ? "klt-plain" : "klt") : "hadamard", err)))
        goto done;
    if (!rep->result.passed) {
        const qf_certify_result *rr = &rep->result;
        st = qf_fail(err, QF_ERR_CERTIFY_FAILED,
                     "kv-rq %s did not pass its gate at -c %d: %s; delta PPL %+.4f%%, KLD mean %.6f p99 %.6f, top-1 "
                     "%.2f%%%s%s; nothing written to %s",
                     rep->variant, s->n_ctx, rr->why, 100 * rr->delta_ppl, rr->kld_mean, rr->kld_p99, 100 * rr->top1,
                     rr->has_baseline ? "; free baseline " : "", rr->has_baseline ? rr->baseline : "", j->out_path);
        goto done;
    }
    t0 = qf_now_sec();
    if ((st = qf_artifact_package(j->out_path, &rep->cert, &best, j->sign_key_path, err))) {
        st = as_stage(err, st, QF_ERR_PACKAGE_FAILED, "package");
        goto done;
    }
    rep->seconds_package = qf_now_sec() - t0;
    rep->packaged = true;
    stage(j, "[5/5 package] %s (kv-rq, %s)", j->out_path, rep->variant);
done:
    qf_certify_ref_free(cref);
    qf_payload_free(&pl);
    qf_payload_free(&best);
    free(bits[0]), free(bits[1]), free(sens[0]), free(sens[1]);
    qf_kv_rq_fit_free(&fit);
    return st;
}

/* ---- one job ---- */

/* Everything that would otherwise fail only after capture and certification, checked before
 * any work: no output is an input (model, corpus paths, signing key) or another output
 * (-o, --eval-out, the awq GGUF) (QF_ERR_ARG); the signing key is a readable PEM Ed25519
 * private key (qf_sign_key_check); every output's directory exists and is writable
 * (QF_ERR_PACKAGE_FAILED for -o and the awq GGUF, QF_ERR_IO for --eval-out). */
static qf_status job_preflight(const qf_job *j, qf_error *err) {
    char gguf[4096];
    awq_gguf_path(j, gguf, sizeof gguf);
    enum { MAX_IN = 64 };
    const char *ins[MAX_IN + 2], *in_names[MAX_IN + 2];
    int n_in = 0;
    ins[n_in] = j->model_path, in_names[n_in++] = "-m";
    ins[n_in] = j->sign_key_path, in_names[n_in++] = "--sign-key";
    for (int i = 0; i < j->n_corpus_paths && n_in < MAX_IN + 2; i++)
        ins[n_in] = j->corpus_paths[i], in_names[n_in++] = "--corpus";
    const char *outs[3] = {j->out_path, j->eval_out_path, j->kind == QF_ARTIFACT_AWQ ? gguf : NULL};
    const char *out_names[3] = {"-o", "--eval-out", "the awq GGUF"};
    qf_status st = qf_check_outputs(ins, in_names, n_in, outs, out_names, 3, err);
    int n_ctx = j->n_ctx_list > 0 ? j->ctx_list[0] : j->n_ctx > 0 ? j->n_ctx : 256; /* stage_model's */
    if (!st && j->kind == QF_ARTIFACT_KV_RQ && j->rq_min_bits != 0 &&
        (j->rq_min_bits < QF_KV_RQ_MIN_BITS || j->rq_min_bits > QF_KV_RQ_MAX_BITS || !(j->rq_bits > 0)))
        st = qf_fail(err, QF_ERR_ARG, "calibrate: --rq-min-bits %d: expected %d..%d, with a --bits budget", j->rq_min_bits,
                     QF_KV_RQ_MIN_BITS, QF_KV_RQ_MAX_BITS);
    if (!st && j->kind == QF_ARTIFACT_KV_RQ && (j->rq_sens_ctx < 0 || j->rq_sens_ctx > n_ctx || j->rq_sens_ctx == 1))
        st = qf_fail(err, QF_ERR_ARG,
                     "calibrate: --sens-ctx %d: expected 2..%d tokens (the capture window -c, the first of --ctx)",
                     j->rq_sens_ctx, n_ctx);
    if (!st && j->sign_key_path) st = qf_sign_key_check(j->sign_key_path, err);
    if (!st) st = qf_check_writable(j->out_path, QF_ERR_PACKAGE_FAILED, err);
    if (!st && j->kind == QF_ARTIFACT_AWQ) st = qf_check_writable(gguf, QF_ERR_PACKAGE_FAILED, err);
    if (!st && j->eval_out_path) st = qf_check_writable(j->eval_out_path, QF_ERR_IO, err);
    return st;
}

/* Certify the chosen payload at another context n: its own context and reference pass over the
 * same evaluation text (chunks of n), its own free baseline, the same gate. */
static qf_status certify_at_ctx(const qf_job *j, shared *s, int n, const qf_payload *pl, qf_certify_result *r,
                                qf_error *err) {
    qf_context_params cp = *qf_context_params_get(s->ctx);
    cp.n_ctx = cp.n_batch = n;
    qf_context *c = qf_context_new(s->model, &cp, err);
    if (!c) return as_stage(err, err ? err->code : QF_ERR_NOMEM, QF_ERR_CERTIFY_FAILED, "certify");
    size_t elen;
    const char *etext = qf_corpus_eval_text(s->corpus, &elen);
    qf_certify_params p = {.n_ctx = n, .n_chunks = s->eval_chunks, .progress = j->progress,
                           .sig_digits = j->kind == QF_ARTIFACT_KV_INT8 ? QF_CERT_SIG_DIGITS_INT8 : 0};
    qf_certify_ref *ref = NULL;
    qf_status st = qf_certify_reference(c, etext, elen, &p, &ref, err);
    if (st) qf_error_prefix(err, "at -c %d: ", n);
    if (!st) st = qf_certify_candidate(c, ref, j->kind, pl, &j->gate, r, err);
    if (!st)
        stage(j, "[4/5 certify] -c %d: PPL %.4f -> %.4f (delta %+.4f%% +/- %.4f%%), KLD mean %.6f p99 %.6f, top-1 %.2f%%; "
                 "baseline %s KLD mean %.6f; gate %s%s%s",
              n, r->ref_ppl, r->cand_ppl, 100 * r->delta_ppl, 100 * r->delta_ppl_err, r->kld_mean, r->kld_p99, 100 * r->top1, r->baseline,
              r->baseline_kld_mean, r->passed ? "passed" : "failed", r->passed ? "" : ": ", r->why);
    qf_certify_ref_free(ref);
    qf_context_free(c);
    return st;
}

qf_status qf_job_run(const qf_job *j, qf_job_report *rep, qf_error *err) {
    memset(rep, 0, sizeof *rep);
    rep->bits_per_element = NAN;
    rep->table_bytes = NAN;
    qf_certificate_init(&rep->cert, j->kind);
    if (!j->model_path) return qf_fail(err, QF_ERR_ARG, "calibrate: no model given");
    if (!j->out_path) return qf_fail(err, QF_ERR_ARG, "calibrate: no output path given");
    if (j->kind != QF_ARTIFACT_KV_INT8 && j->kind != QF_ARTIFACT_KV_DICT && j->kind != QF_ARTIFACT_AWQ &&
        j->kind != QF_ARTIFACT_KV_RQ)
        return qf_fail(err, QF_ERR_ARG, "calibrate: unknown artifact kind %d", (int)j->kind);
    qf_status pre = job_preflight(j, err);
    if (pre) return pre;

    shared s = {0};
    qf_payload best = {0}, cand = {0};
    qf_status st;
    /* every rank reaches the agreement, so a rank that cannot read an input fails them all */
    st = stage_corpus(j, &s, rep, err);
    if (!st) st = stage_model(j, &s, err);
    if ((st = qf_par_agree(st, err))) goto done;
    if ((st = same_inputs(&s, err))) goto done;
    rep->f16_kv_bytes_per_token = f16_bytes_per_token(s.model);
    if (j->kind == QF_ARTIFACT_KV_RQ && qf_mpi_size() > 1) {
        st = qf_fail(err, QF_ERR_UNSUPPORTED, "calibrate: kv-rq is not sharded over MPI ranks yet: run it with one process");
        goto done;
    }
    if (j->kind == QF_ARTIFACT_AWQ && qf_mpi_size() > 1) {
        st = qf_fail(err, QF_ERR_UNSUPPORTED, "calibrate: awq is not sharded over MPI ranks yet: run it with one process");
        goto done;
    }
    if (j->kind == QF_ARTIFACT_AWQ) {
        st = run_awq(j, &s, rep, err);
        goto done;
    }
    if ((st = stage_capture(j, &s, rep, err))) goto done;
    if (j->kind == QF_ARTIFACT_KV_RQ) {
        st = run_rq(j, &s, rep, err);
        goto done;
    }

    double t_learn = 0, t_cert = 0, t0;

    int n_cand = j->kind == QF_ARTIFACT_KV_INT8 ? N_INT8_CANDIDATES : 1;
    int best_i = -1;
    for (int ci = 0; ci < n_cand; ci++) {
        qf_payload_free(&cand);
        memset(&cand, 0, sizeof cand);
        char variant[32];
        t0 = qf_now_sec();
        /* under mpirun candidate ci is learned on rank ci % N and shared with every rank */
        int owner = ci % qf_mpi_size();
        st = QF_OK;
        if (j->kind == QF_ARTIFACT_KV_INT8) {
            set_variant(variant, sizeof variant, "%s", int8_candidates[ci].name);
            if (qf_mpi_rank() == owner) st = learn_int8(j, &s, &int8_candidates[ci], &cand, err);
        } else {
            set_variant(variant, sizeof variant, "%dx%d-%s%s", j->dict_atoms, j->dict_sparsity,
                        qf_kv_coef_name(j->dict_coef), j->dict_version == 2 ? "-v2" : "");
            if (qf_mpi_rank() == owner) st = learn_dict(j, &s, j->dict_atoms, j->dict_sparsity, &cand, err);
        }
        qf_status cst = share_payload(owner, j->kind, &st, err, &cand, err);
        if (cst) {
            st = cst;
            goto done;
        }
        t_learn += qf_now_sec() - t0;
        if (st) {
            st = as_stage(err, st, st == QF_ERR_ARG || st == QF_ERR_CAPTURE_FAILED ? QF_ERR_CAPTURE_FAILED : st, "learn");
            goto done;
        }
        stage(j, "[3/5 learn] %s %s in %.1f s", qf_artifact_kind_name(j->kind), variant, qf_now_sec() - t0);
        t0 = qf_now_sec();
        /* the reference runs once, before the first candidate; every candidate shares it */
        if (!s.ref && (st = stage_reference(j, &s, err))) goto done;
        qf_certify_result r;
        st = qf_certify_candidate(s.ctx, s.ref, j->kind, &cand, &j->gate, &r, err);
        t_cert += qf_now_sec() - t0;
        if (st) goto done;
        stage(j, "[4/5 certify] %s: PPL %.4f -> %.4f (delta %+.4f%% +/- %.4f%%), KLD mean %.6f p99 %.6f, top-1 %.2f%%, "
                 "KV %.0f B/token (f16 %.0f), %.3f bits/element",
              variant, r.ref_ppl, r.cand_ppl, 100 * r.delta_ppl, 100 * r.delta_ppl_err, r.kld_mean, r.kld_p99, 100 * r.top1,
              r.cand_kv_bytes_per_token, rep->f16_kv_bytes_per_token, r.bits_per_element);
        if (r.has_baseline)
            stage(j, "[4/5 certify] free baseline %s (%.1f bits) on the same tokens: delta %+.4f%%, KLD mean %.6f p99 %.6f; "
                     "gate %s%s%s",
                  r.baseline, r.baseline_bits, 100 * r.baseline_delta_ppl, r.baseline_kld_mean, r.baseline_kld_p99,
                  r.passed ? "passed" : "failed", r.passed ? "" : ": ", r.why);
        if (rep->n_tried < QF_JOB_MAX_TRIED) {
            set_variant(rep->tried[rep->n_tried].variant, sizeof rep->tried[0].variant, "%s", variant);
            rep->tried[rep->n_tried++].result = r;
        }
        /* keep the lower mean KLD (the end metric; ΔPPL is noise at these levels); NaN never wins */
        if (best_i < 0 || (r.kld_mean < rep->result.kld_mean) || (isnan(rep->result.kld_mean) && !isnan(r.kld_mean))) {
            best_i = ci;
            rep->result = r;
            set_variant(rep->variant, sizeof rep->variant, "%s", variant);
            qf_payload tmp = best;
            best = cand;
            cand = tmp;
        }
    }
    /* the chosen candidate at every other context of the --ctx list */
    rep->n_ctx_results = 1;
    rep->ctx_results[0].n_ctx = s.n_ctx;
    rep->ctx_results[0].result = rep->result;
    t0 = qf_now_sec();
    for (int ci = 1; ci < j->n_ctx_list && ci < QF_JOB_MAX_CTX; ci++) {
        qf_certify_result rc;
        if ((st = certify_at_ctx(j, &s, j->ctx_list[ci], &best, &rc, err))) goto done;
        rep->ctx_results[rep->n_ctx_results].n_ctx = j->ctx_list[ci];
        rep->ctx_results[rep->n_ctx_results++].result = rc;
    }
    t_cert += qf_now_sec() - t0;
    for (int ci = 0; ci < rep->n_ctx_results; ci++)
        if (rep->ctx_results[ci].result.passed) rep->certified_ctx[rep->n_certified_ctx++] = rep->ctx_results[ci].n_ctx;
    rep->seconds_learn = t_learn;
    rep->seconds_certify = t_cert;
    report_rate(rep, j->kind, &best, qf_model_hparams(s.model), s.n_ctx);
    if ((st = fill_cert(j, &s, rep, err))) goto done;
    const qf_certify_result *r = &rep->result;
    if (!r->passed) {
        st = qf_fail(err, QF_ERR_CERTIFY_FAILED,
                     "%s %s did not pass its gate at -c %d: %s; delta PPL %+.4f%% (max %.4f%%), KLD mean %.6f p99 %.6f, "
                     "top-1 %.2f%%, %.3f bits/element%s%s; ref PPL %.4f, candidate %.4f; nothing written to %s",
                     qf_artifact_kind_name(j->kind), rep->variant, s.n_ctx, r->why, 100 * r->delta_ppl,
                     100 * r->gate.max_delta_ppl, r->kld_mean, r->kld_p99, 100 * r->top1, r->bits_per_element,
                     r->has_baseline ? "; free baseline " : "", r->has_baseline ? r->baseline : "", r->ref_ppl,
                     r->cand_ppl, j->out_path);
        goto done;
    }
    t0 = qf_now_sec();
    /* one artifact, written by rank 0 (atomically); every rank learns how that went */
    if (qf_mpi_rank() == 0) st = qf_artifact_package(j->out_path, &rep->cert, &best, j->sign_key_path, err);
    st = qf_par_agree(st, err);
    rep->seconds_package = qf_now_sec() - t0;
    if (st) {
        st = as_stage(err, st, QF_ERR_PACKAGE_FAILED, "package");
        goto done;
    }
    rep->packaged = true;
    stage(j, "[5/5 package] %s (%s, %s)", j->out_path, qf_artifact_kind_name(j->kind), rep->variant);
done:
    /* past the first agreement every failure is collective or the same on every rank: agree on
     * it so rank 0 alone reports it */
    if (st && qf_mpi_size() > 1 && !qf_mpi_error_shared(err)) st = qf_par_agree(st, err);
    qf_payload_free(&best);
    qf_payload_free(&cand);
    shared_free(&s);
    return st;
}

/* ---- sweep ---- */

qf_status qf_ctx_list_parse(const char *str, int *out, int max, int *n, qf_error *err) {
    *n = 0;
    const char *p = str;
    while (p && *p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < 8 || v > (1 << 20))
            return qf_fail(err, QF_ERR_ARG, "--ctx '%s': expected N[,N...], each context in [8, %d], e.g. 512,4096", str,
                           1 << 20);
        for (int i = 0; i < *n; i++)
            if (out[i] == (int)v) return qf_fail(err, QF_ERR_ARG, "--ctx '%s': context %ld is listed twice", str, v);
        if (*n >= max) return qf_fail(err, QF_ERR_ARG, "--ctx '%s': at most %d contexts", str, max);
        out[(*n)++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && !*p) return qf_fail(err, QF_ERR_ARG, "--ctx '%s': trailing comma", str);
    }
    if (*n == 0) return qf_fail(err, QF_ERR_ARG, "--ctx: no context given");
    return QF_OK;
}

qf_status qf_dict_configs_parse(const char *str, qf_dict_config *out, int max, int *n, qf_error *err) {
    *n = 0;
    const char *p = str;
    while (p && *p) {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p || (*end != 'x' && *end != 'X'))
            return qf_fail(err, QF_ERR_ARG, "--configs '%s': expected ATOMSxSPARSITY[,...], e.g. 256x4,512x8", str);
        const char *q = end + 1;
        long sp = strtol(q, &end, 10);
        if (end == q || (*end && *end != ','))
            return qf_fail(err, QF_ERR_ARG, "--configs '%s': expected ATOMSxSPARSITY[,...], e.g. 256x4,512x8", str);
        if (a < 1 || a > QF_KV_MAX_ATOMS || sp < 1 || sp > 64 || sp > a)
            return qf_fail(err, QF_ERR_ARG, "--configs: %ldx%ld: atoms must be in [1, %d], sparsity in [1, min(atoms, 64)]",
                           a, sp, QF_KV_MAX_ATOMS);
        if (*n >= max) return qf_fail(err, QF_ERR_ARG, "--configs: at most %d configurations", max);
        out[*n].n_atoms = (int)a;
        out[*n].sparsity = (int)sp;
        (*n)++;
        p = *end == ',' ? end + 1 : end;
    }
    if (*n == 0) return qf_fail(err, QF_ERR_ARG, "--configs: no configuration given");
    return QF_OK;
}

qf_status qf_sweep_run(const qf_job *j, const qf_dict_config *cfgs, int n, qf_sweep_row *rows, double *ref_ppl,
                       qf_error *err) {
    qf_job_report rep;
    memset(&rep, 0, sizeof rep);
    memset(rows, 0, (size_t)n * sizeof *rows);
    *ref_ppl = NAN;
    if (!j->model_path) return qf_fail(err, QF_ERR_ARG, "sweep: no model given");
    shared s = {0};
    qf_status st;
    st = stage_corpus(j, &s, &rep, err);
    if (!st) st = stage_model(j, &s, err);
    if ((st = qf_par_agree(st, err)) || (st = same_inputs(&s, err)) || (st = stage_capture(j, &s, &rep, err)) ||
        (st = stage_reference(j, &s, err)))
        goto done;
    *ref_ppl = qf_certify_ref_ppl(s.ref);
    const qf_hparams *hp = qf_model_hparams(s.model);
    /* under mpirun the configurations are learned in rounds of N, config i on rank i % N,
     * then each is shared and certified by all ranks together (chunks sharded) in order */
    const int N = qf_mpi_size(), R = qf_mpi_rank();
    qf_payload *pls = calloc((size_t)N, sizeof *pls);
    qf_error *errs = calloc((size_t)N, sizeof *errs);
    qf_status *lst = calloc((size_t)N, sizeof *lst);
    double *tls = calloc((size_t)N, sizeof *tls);
    if (!pls || !errs || !lst || !tls) {
        free(pls), free(errs), free(lst), free(tls);
        st = qf_fail(err, QF_ERR_NOMEM, "sweep: out of memory");
        goto done;
    }
    for (int base = 0; base < n && !st; base += N) {
        for (int q = 0; q < N; q++) {
            qf_payload_free(&pls[q]);
            memset(&pls[q], 0, sizeof pls[q]);
            memset(&errs[q], 0, sizeof errs[q]);
            lst[q] = QF_OK;
        }
        if (base + R < n) {
            double t0 = qf_now_sec();
            lst[R] = learn_dict(j, &s, cfgs[base + R].n_atoms, cfgs[base + R].sparsity, &pls[R], &errs[R]);
            tls[R] = qf_now_sec() - t0;
        }
        for (int q = 0; q < N && base + q < n && !st; q++) {
            int i = base + q;
            qf_sweep_row *row = &rows[i];
            row->cfg = cfgs[i];
            row->bits_per_elem = qf_kv_code_bits(cfgs[i].n_atoms, cfgs[i].sparsity, j->dict_coef) / hp->head_dim;
            row->f16_kv_bytes_per_token = f16_bytes_per_token(s.model);
            if ((st = share_payload(q, QF_ARTIFACT_KV_DICT, &lst[q], &errs[q], &pls[q], err))) break;
            if ((st = qf_par_bcast(&tls[q], sizeof tls[q], q, err))) break;
            qf_error e = errs[q];
            row->status = lst[q];
            if (!row->status)
                row->status = qf_certify_candidate(s.ctx, s.ref, QF_ARTIFACT_KV_DICT, &pls[q], &j->gate, &row->result, &e);
            if (row->status) {
                snprintf(row->error, sizeof row->error, "%s", e.msg);
                stage(j, "[sweep] %dx%d: %s: %s", cfgs[i].n_atoms, cfgs[i].sparsity, qf_status_name(row->status), e.msg);
                if (row->status == QF_ERR_NOMEM) {
                    st = qf_fail(err, QF_ERR_NOMEM, "sweep: %s", e.msg);
                    break;
                }
                continue;
            }
            row->kv_bytes_per_token = row->result.cand_kv_bytes_per_token;
            stage(j, "[sweep] %dx%d: learned in %.1f s, delta PPL %+.4f%%, %s", cfgs[i].n_atoms, cfgs[i].sparsity,
                  tls[q], 100 * row->result.delta_ppl, row->result.passed ? "passed" : "failed");
        }
    }
    for (int q = 0; q < N; q++) qf_payload_free(&pls[q]);
    free(pls), free(errs), free(lst), free(tls);
done:
    if (st && qf_mpi_size() > 1 && !qf_mpi_error_shared(err)) st = qf_par_agree(st, err);
    shared_free(&s);
    return st;
}

/* ---- one learner, for qforge analyze ---- */

int qf_job_learn_variants(qf_artifact_kind kind) {
    return kind == QF_ARTIFACT_KV_INT8 ? N_INT8_CANDIDATES : kind == QF_ARTIFACT_KV_DICT ? 1 : 0;
}

qf_status qf_job_learn(const qf_job *j, qf_context *ctx, const qf_capture *cap, int variant, qf_payload *out,
                       char *label, size_t label_cap, qf_error *err) {
    /* the learners read only the capture and the context's thread count from the shared state */
    shared s = {0};
    s.ctx = ctx;
    s.cap = (qf_capture *)cap;
    if (j->kind == QF_ARTIFACT_KV_INT8) {
        if (variant < 0 || variant >= N_INT8_CANDIDATES)
            return qf_fail(err, QF_ERR_ARG, "learn: kv-int8 has variants 0 to %d", N_INT8_CANDIDATES - 1);
        set_variant(label, label_cap, "%s", int8_candidates[variant].name);
        return learn_int8(j, &s, &int8_candidates[variant], out, err);
    }
    if (j->kind == QF_ARTIFACT_KV_DICT) {
        set_variant(label, label_cap, "%dx%d-%s", j->dict_atoms, j->dict_sparsity, qf_kv_coef_name(j->dict_coef));
        return learn_dict(j, &s, j->dict_atoms, j->dict_sparsity, out, err);
    }
    return qf_fail(err, QF_ERR_NOT_IMPLEMENTED, "learn: no KV learner for artifact kind %s",
                   qf_artifact_kind_name(j->kind));
}
