/* qforge/forge.h: the forge pipeline's driver: certify a candidate artifact against the
 * reference, run one calibration job (corpus -> capture -> learn -> certify -> package), or
 * sweep several kv-dict configurations paying one capture and one reference pass.
 *
 * Certification is honest (docs/forge.md): reference and candidate run in the SAME context
 * (same params, threads, batch, code path) over the same evaluation tokens, which come only
 * from the corpus's evaluation split; they differ only by the bound artifact. The one thing
 * certification changes on the context (the KV binding) is restored on every exit path.
 * A failed gate packages nothing: the job returns QF_ERR_CERTIFY_FAILED with the numbers. */
#ifndef QFORGE_FORGE_H
#define QFORGE_FORGE_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qforge/artifact.h"
#include "qforge/capture.h"
#include "qforge/error.h"
#include "qforge/kvlearn.h"
#include "qforge/model.h"

#define QF_GATE_DEFAULT_MAX_DELTA_PPL 0.05
#define QF_JOB_MAX_CTX 8 /* contexts in one --ctx list */

/* qf_gate (the thresholds) and qf_gate_judge (the one predicate) are in qforge/artifact.h. */

/* The calibrate default: |ΔPPL| <= 5 %, KLD thresholds by the artifact's rate (by_rate),
 * two-sided, vs_baseline on. */
QF_API qf_gate qf_gate_default(void);

/* ================================ certify ================================ */

typedef struct {
    int n_ctx;     /* chunk length = the context's size is enough (default 256) */
    int n_chunks;  /* chunks evaluated; <= 0: all the evaluation text holds */
    bool progress; /* progress bars on a TTY */
    /* > 0: the gate judges every measured number of a result (PPLs, ΔPPL, KLD mean / p99, top-1,
     * the free baseline's KLD) rounded to this many significant digits (the decimal rounding of
     * printf's %.*e), so the verdict does not hang on the last digits of one device's
     * arithmetic; the result keeps the numbers as measured. 0: judged as measured
     * (docs/gpu.md, "The certificate, CPU vs GPU") */
    int sig_digits;
} qf_certify_params;

/* the significant digits a kv-int8 certificate's gate is judged at (qforge calibrate, any device) */
#define QF_CERT_SIG_DIGITS_INT8 3

typedef struct {
    double ref_ppl, cand_ppl;
    double delta_ppl;          /* (cand - ref) / ref */
    double kld_mean, kld_p99;  /* KL(ref || cand) per scored token, nats */
    double kld_err;            /* standard error of kld_mean */
    double top1;               /* same argmax, fraction of scored positions */
    int n_ctx, n_chunks;
    int64_t n_scored;          /* positions scored (second half of every chunk) */
    int64_t eval_tokens;       /* tokens run: n_chunks * n_ctx */
    double ref_kv_bytes_per_token, cand_kv_bytes_per_token; /* whole model, K + V */
    double seconds;            /* candidate pass */
    bool passed;               /* the gate's verdict on these numbers */
    /* since issue 15 */
    double bits_per_element;   /* the candidate's rate (qf_artifact_bits_per_element); NaN for awq */
    bool has_baseline;         /* the free baseline at that rate was run on the same tokens */
    char baseline[24];         /* "q8_0" or "q4_0+hadamard" (plain "q4_0" when head_dim is no power of two) */
    double baseline_bits;      /* its bits per element (8.5, 4.5) */
    double baseline_ppl, baseline_delta_ppl, baseline_kld_mean, baseline_kld_p99, baseline_top1;
    qf_gate gate;              /* the resolved gate the verdict used */
    char why[256];             /* the first failing condition when !passed, else "" */
    double delta_ppl_err;      /* paired per-chunk standard error of delta_ppl (qf_ppl_result) */
} qf_certify_result;

typedef struct qf_certify_ref qf_certify_ref; /* reference numbers and its saved log-probs */

/* Run the reference once over the evaluation text (tokenized as `qforge ppl -f` does: BOS
 * first when the vocabulary adds it, chunks of n_ctx, first token of each chunk -> BOS,
 * second half scored) and keep its log-probabilities in a temporary file (llama-perplexity's
 * KL-divergence base format) for the candidates. The context must have nothing bound.
 * Errors: QF_ERR_CERTIFY_FAILED (e.g. the text is shorter than 2 * n_ctx tokens). */
QF_API qf_status qf_certify_reference(qf_context *c, const char *eval_text, size_t len,
                               const qf_certify_params *p, qf_certify_ref **out, qf_error *err);
QF_API double qf_certify_ref_ppl(const qf_certify_ref *ref);
QF_API void qf_certify_ref_free(qf_certify_ref *ref); /* removes the temporary file */

/* Bind the candidate (kind, payload) to the same context, run the same tokens, unbind (on
 * every path), fill *r and judge the gate (resolved for the kind and the payload's rate,
 * qf_artifact_bits_per_element at the reference's chunk size; the free baseline at that rate
 * is measured, qf_certify_baseline, and recorded whether or not the gate uses it). A gate failure is QF_OK with r->passed false;
 * errors (binding, evaluation) are QF_ERR_CERTIFY_FAILED with the cause in the message. The
 * payload is bound in place (qf_context_bind_payload_in_place); should the unbind fail (the
 * error says "restoring the context's KV mode"), it must outlive the context. */
QF_API qf_status qf_certify_candidate(qf_context *c, const qf_certify_ref *ref, qf_artifact_kind kind,
                               const qf_payload *payload, const qf_gate *gate,
                               qf_certify_result *r, qf_error *err);

/* The candidate is another model (e.g. an AWQ re-quantized GGUF) run in its own context,
 * created with the reference context's params: same tokens and chunking as the reference. */
QF_API qf_status qf_certify_context(qf_context *cand, const qf_certify_ref *ref, const qf_gate *gate,
                             qf_certify_result *r, qf_error *err);

/* Whether numbers meet a gate (NaN never does): qf_gate_judge on r's numbers (its baseline
 * when r->has_baseline). g is used as given (resolve a by_rate gate first). */
QF_API bool qf_gate_passes(const qf_gate *g, const qf_certify_result *r);

/* The free baseline for a rate: q8_0 above 6 bits per element, q4_0 + --kv-rot hadamard at or
 * below (plain q4_0 when head_dim is not a power of two), run in a fresh plain-cache context
 * with c's params over the reference's tokens. Fills r->has_baseline and r->baseline*.
 * Measured once per (ref, baseline) and cached in ref (not thread-safe). */
QF_API qf_status qf_certify_baseline(qf_context *c, const qf_certify_ref *ref, double bits_per_element,
                              qf_certify_result *r, qf_error *err);

/* ================================ jobs ================================ */

/* The default calibration budget: tokens captured and K (and V) vectors kept per layer. */
#define QF_JOB_DEFAULT_BUDGET 16384

typedef struct {
    const char *model_path;
    qf_artifact_kind kind;
    /* corpus: paths (files or directories), the built-in demo corpus, Ollama synthesis */
    const char *const *corpus_paths;
    int n_corpus_paths;
    bool builtin;
    const char *ollama_url, *ollama_model;
    int synth_docs;
    double eval_frac;           /* 0 = QF_CORPUS_DEFAULT_EVAL_FRAC */
    qf_gate gate;
    int n_ctx;                  /* capture window and evaluation chunk (default 256) */
    int ctx_list[QF_JOB_MAX_CTX];           /* --ctx: certify at each of these contexts (the first is the
                                   capture window and the primary certification; it replaces
                                   n_ctx); n_ctx_list 0 = just n_ctx */
    int n_ctx_list;
    int64_t max_calib_tokens;   /* calibration tokens captured (0 = 16384; < 0 = all) */
    int eval_chunks;            /* evaluation chunks (0 = 16; < 0 = all) */
    int n_threads;              /* 0 = all cores */
    qf_kv_mode ref_kv;          /* the reference KV mode (default f32) */
    int64_t capture_per_layer;  /* K (and V) vectors kept per layer (0 = QF_JOB_DEFAULT_BUDGET) */
    uint64_t seed;              /* capture reservoir and dictionary seed (default 1) */
    bool arith_fast;            /* --arith fast: certify in each device's fastest arithmetic instead
                                   of the canonical one (the certificate then depends on the device) */
    qf_device capture_device;   /* where the capture runs (auto: the GPU when one is found, K/V read
                                   back from GPU memory); certification runs on the CPU, except
                                   kv-int8 with CUDA: reference, candidates and free baseline on
                                   the GPU, the first chunk re-checked on the CPU (config keys
                                   certify_device, cpu_recheck_chunk0_*) */
    /* kv-int8 */
    double int8_percentile;     /* clip percentile of |x| (default 100 = absmax) */
    /* kv-dict */
    int dict_atoms, dict_sparsity, dict_iters; /* 256, 8, 10 */
    qf_kv_coef dict_coef;       /* f16 */
    int64_t dict_max_train;     /* training vectors per (layer, stream) (0 = all captured) */
    int dict_version;           /* 1 (default): v1 payload, post-RoPE K, byte indices; 2: K learned
                                   and stored before RoPE, bit-packed indices (up to 4096 atoms =
                                   12 bits), error bound; CPU only */
    double dict_tol_quantile;   /* v2: 0 = fixed sparsity; q in (0, 1]: error-bounded OMP whose
                                   bound per (layer, stream) is the q-quantile of the training
                                   vectors' relative residual at the cap */
    /* awq (include/qforge/awq.h): the re-quantized GGUF is written here (default: OUT.qfa
     * with .gguf instead of .qfa) */
    const char *awq_gguf_path;
    /* kv-rq (include/qforge/kv_rq.h) */
    double rq_bits;             /* budget in bits per element, every overhead included at n_ctx
                                   (0 = the fewest bits that pass the gate) */
    int rq_sink, rq_window;     /* f16 sink / recent-window tokens (-1 = the learner's choice) */
    double rq_k_alpha;          /* K channel smoothing exponent (default 0.5) */
    int rq_sens_chunks;         /* calibration chunks per sensitivity run (0 = default: 2, 4 with format 3) */
    int rq_prerope;             /* 1: keys captured, learned and stored before RoPE, 0: after, -1
                                   (default): before with a budget of at most 3 bits */
    int rq_qaware;              /* 1 (default 0): channel scales weighted by query energy (K) and attn_output column norms (V) */
    double rq_v_alpha;          /* V channel smoothing exponent with rq_qaware (default 0.5) */
    int rq_vpred;               /* V predicted from the same layer's K: 1 / -1 (default) with pre-RoPE
                                   keys, 0 never */
    double rq_vpred_noise;      /* the V predictor's ridge: relative input noise (default 0.2) */
    int rq_min_bits;            /* with rq_bits: the fewest code bits any (layer, stream) gets, 1..6 (0 =
                                   default: 1 with a budget of at most 3 bits, else 2; 3 avoids 2-bit codebooks and
                                   their heavy per-token tails) */
    int rq_sens_ctx;            /* tokens per sensitivity / window-split chunk (0 = min(n_ctx, 512));
                                   at most the capture window n_ctx (QF_ERR_ARG otherwise) */
    int rq_transform;           /* 0: Hadamard rows (formats 1, 2); 1: KLT with per-coordinate widths
                                   (format 3, kv_rq.h), learned in the attention's metric; -1 (default):
                                   1 with an rq_bits budget, else 0 (docs/kv-rq.md "Format 3 at 4 bits") */
    int rq_klt_plain;           /* with rq_transform 1: 1 = the plain (unweighted) KLT */
    int rq_klt_eighths;         /* format 3: 1 (default) = code rates in 1/8-bit steps per (layer, stream)
                                   from a floor of min_bits >= 1; 0 = whole bits (docs/kv-rq.md) */
    /* outputs */
    const char *out_path;       /* the .qfa (required for qf_job_run) */
    const char *sign_key_path;  /* PEM Ed25519 private key, or NULL */
    const char *eval_out_path;  /* also write the exact evaluation text here, or NULL */
    bool progress;              /* progress bars on a TTY */
    FILE *log;                  /* one line per stage, or NULL */
} qf_job;

QF_API void qf_job_default(qf_job *j);

#define QF_JOB_MAX_TRIED 4

/* Parse "512,4096" (--ctx): 1..max distinct contexts, each in [8, 1 << 20], comma-separated. */
QF_API qf_status qf_ctx_list_parse(const char *s, int *out, int max, int *n, qf_error *err);

typedef struct {
    qf_certificate cert;        /* provenance + numbers as far as the job got (free below) */
    qf_certify_result result;   /* the chosen candidate's numbers */
    bool packaged;              /* out_path was written */
    char variant[32];           /* "per-channel", "per-head", "256x8 f16", ... */
    int n_tried;                /* candidates certified (kv-int8 tries two scale modes) */
    struct {
        char variant[32];
        qf_certify_result result;
    } tried[QF_JOB_MAX_TRIED];
    double f16_kv_bytes_per_token;
    double awq_gap_closed;      /* awq: (RTN PPL - AWQ PPL) / (RTN PPL - reference PPL); tried[1] is RTN */
    bool awq_on_gpu;            /* awq: capture, alpha search and block quantizer ran on the GPU */
    /* the chosen candidate at every context of the job's --ctx list ([0] = result above) */
    int n_ctx_results;
    struct {
        int n_ctx;
        qf_certify_result result;
    } ctx_results[QF_JOB_MAX_CTX];
    int certified_ctx[QF_JOB_MAX_CTX]; /* the contexts whose gate passed (recorded in the certificate) */
    int n_certified_ctx;
    double bits_per_element;    /* the packaged payload's rate at its largest certified context (NaN: awq) */
    double table_bytes;         /* its fixed per-model tables, not in that rate (qf_artifact_table_bytes; NaN: awq) */
    int tables_pay_off_ctx;     /* the smallest context at which the rate with the tables amortized over it is at
                                 * most the free baseline's bits (0: no baseline, or not below 2^24 tokens) */
    int64_t calib_tokens;
    double seconds_corpus, seconds_capture, seconds_learn, seconds_certify, seconds_package;
} qf_job_report;

/* Run one job. Errors, each with its own status and exit code: QF_ERR_CORPUS_EMPTY,
 * QF_ERR_OLLAMA_UNAVAILABLE, QF_ERR_CAPTURE_FAILED, QF_ERR_CERTIFY_FAILED (gate failed: the
 * numbers are in the message and in *rep; nothing is written), QF_ERR_PACKAGE_FAILED,
 * QF_ERR_NOT_IMPLEMENTED (a learner that is not built), QF_ERR_ARG / _IO / _FORMAT for bad
 * input. rep is always filled as far as the job got; free with qf_job_report_free. */
QF_API qf_status qf_job_run(const qf_job *j, qf_job_report *rep, qf_error *err);
QF_API void qf_job_report_free(qf_job_report *rep);

/* ================================ sweep ================================ */

typedef struct {
    int n_atoms, sparsity;
} qf_dict_config;

/* Parse "256x4,512x8" (atoms x sparsity, comma-separated, at most max entries). */
QF_API qf_status qf_dict_configs_parse(const char *s, qf_dict_config *out, int max, int *n, qf_error *err);

typedef struct {
    qf_dict_config cfg;
    double bits_per_elem;        /* code bits / head_dim (dictionaries amortised) */
    double kv_bytes_per_token;   /* measured on the bound cache */
    double f16_kv_bytes_per_token;
    qf_certify_result result;
    qf_status status;            /* QF_OK when certified (passed or not) */
    char error[256];             /* when status != QF_OK */
} qf_sweep_row;

/* Certify every config (kv-dict, j->dict_iters / dict_coef / dict_max_train) with one
 * corpus, one capture and one reference pass. A config that cannot be learned gets its own
 * row status; the call fails only when the shared stages fail. rows has n entries. */
QF_API qf_status qf_sweep_run(const qf_job *j, const qf_dict_config *cfgs, int n, qf_sweep_row *rows,
                       double *ref_ppl, qf_error *err);

/* ================================ one learner ================================ */

/* How many candidates qf_job_run tries for a kind (qf_job_learn's variants): kv-int8 its
 * layouts (token-rot, per-channel), kv-dict 1, other kinds 0. */
QF_API int qf_job_learn_variants(qf_artifact_kind kind);

/* Learn one KV candidate payload of kind j->kind from a capture of the calibration split,
 * with exactly the learner qf_job_run certifies (kv-int8: variant i = qf_job_run's i-th
 * candidate, 0 = token-rot, 1 = per-channel, with j->int8_percentile; kv-dict: j->dict_atoms x j->dict_sparsity,
 * j->dict_iters, j->dict_coef, j->dict_max_train, j->seed). ctx supplies the thread count.
 * `label` receives the variant's name ("token-rot", "256x8-f16"). *out must be empty.
 * Errors: the learner's (QF_ERR_CAPTURE_FAILED when too few vectors were captured),
 * QF_ERR_NOT_IMPLEMENTED for a kind with no KV learner. For `qforge analyze`. */
QF_API qf_status qf_job_learn(const qf_job *j, qf_context *ctx, const qf_capture *cap, int variant,
                       qf_payload *out, char *label, size_t label_cap, qf_error *err);

#endif
