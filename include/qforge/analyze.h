/* qforge/analyze.h: `qforge analyze`, every KV-cache method judged on the end metric.
 *
 * The corpus is split as the forge splits it (calibration / disjoint evaluation documents).
 * The reference is the model with an f32 KV cache over the evaluation split (chunks of n_ctx,
 * second half of each scored, as `qforge ppl`); every method and rate then runs the SAME
 * evaluation tokens with its KV cache in that mode: plain cache types (f16, q8_0, q4_0, with
 * and without the Hadamard rotation) in a context of their own, learned artifacts (kv-int8,
 * kv-dict at several sizes, kv-rq at budgets) learned from a capture of the calibration split
 * and bound to the reference context as certification does. Per point: bits per element,
 * delta PPL, mean and p99 KL(ref || method), same-top-1. Then the Pareto frontier over
 * (bits per element, mean KLD) and a verdict per method.
 *
 * Bits per element count what the cache stores per token, every per-token overhead included
 * (block scales, codes, per-vector scales, sink and window rows amortised at n_ctx): for a plain
 * cache kv_bytes_per_token * 8 / (n_layer * n_head_kv * head_dim * 2), for a learned payload
 * qf_artifact_bits_per_element (what `qforge verify` reports). Static side tables (calibrated
 * scales, dictionaries) are reported next to it (table_bytes) and amortised over one context
 * (bits_per_element_with_tables); the frontier uses bits_per_element unless tables_in_rate. */
#ifndef QFORGE_ANALYZE_H
#define QFORGE_ANALYZE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qforge/api.h"
#include "qforge/error.h"
#include "qforge/forge.h"
#include "qforge/model.h"

#define QF_ANALYZE_MAX_RATES 8

typedef struct {
    const char *model_path;
    const char *const *corpus_paths; /* files or directories */
    int n_corpus_paths;
    bool builtin;             /* the built-in demo corpus (also used when no path is given) */
    double eval_frac;         /* 0 = QF_CORPUS_DEFAULT_EVAL_FRAC */
    int n_ctx;                /* evaluation chunk and capture window (512; capped at the model's) */
    int eval_chunks;          /* evaluation chunks per pass (12; < 0 = all the split holds) */
    int64_t max_calib_tokens; /* calibration tokens captured for the learners (8192) */
    int64_t capture_per_layer; /* K (and V) vectors kept per layer (4096) */
    int n_threads;            /* 0 = all cores */
    qf_device capture_device; /* where the capture runs; evaluation always runs on the CPU */
    bool cross_check;         /* capture the first window on the scalar reference route too */
    const char *methods;      /* comma-separated names (see qf_analyze_method_name); NULL = all */
    qf_dict_config dict[QF_ANALYZE_MAX_RATES]; /* kv-dict sizes (256x4, 256x8, 256x16) */
    int n_dict;
    int dict_iters;           /* k-SVD iterations (10) */
    qf_kv_coef dict_coef;     /* f16 */
    int rq_bits[QF_ANALYZE_MAX_RATES]; /* kv-rq budgets (default 3, 4) */
    int n_rq_bits;
    bool tables_in_rate;      /* judge on bits_per_element_with_tables */
    uint64_t seed;            /* capture reservoir and learners (1) */
    bool progress;            /* progress bars on a TTY */
    FILE *log;                /* one line per stage and point, or NULL */
} qf_analyze_params;

QF_API void qf_analyze_params_default(qf_analyze_params *p);

/* The method table, in report order: f16, q8_0, q4_0, q8_0+hadamard, q4_0+hadamard, kv-int8,
 * kv-dict and kv-rq. i out of range: NULL. */
QF_API const char *qf_analyze_method_name(int i);
/* Whether the method learns from the calibration split (a capture is needed). */
QF_API bool qf_analyze_method_learned(int i);

typedef struct {
    char method[32];      /* a method table name: "q4_0+hadamard", "kv-dict" */
    char label[32];       /* the rate: "q4_0", "256x8-f16", "per-channel", "3b" */
    double bits_per_element;             /* per-token storage, overheads included */
    double kv_bytes_per_token;           /* whole model, K + V */
    double table_bytes;                  /* static side tables of a learned method (0 for plain) */
    double bits_per_element_with_tables; /* tables amortised over one context of n_ctx tokens */
    double ppl, delta_ppl;               /* delta = (ppl - ref) / ref */
    double kld_mean, kld_err, kld_p99;   /* KL(ref || method), nats per scored token */
    double top1;                         /* same argmax as the reference, fraction */
    bool passes_gate;                    /* would pass the default certification gate (a plain
                                            cache: the KV thresholds for its rate) */
    double seconds;                      /* learning + evaluation */
    /* filled by qf_analyze_judge */
    bool on_frontier;
    int dominated_by;     /* index of the frontier point that beats it at no more bits, or -1 */
    bool within_noise;    /* that point's mean KLD is within 2 standard errors of this one's */
} qf_analyze_point;

typedef struct {
    char method[32];
    char label[32];
    char reason[256];
} qf_analyze_skip;

typedef struct {
    char method[32];
    int n_points, n_on_frontier;
    char verdict[768]; /* "on the frontier at 4.50 b (...); dominated at 8.50 b by ..." */
} qf_analyze_verdict;

typedef struct {
    int n_layer, n_head_kv, head_dim;
    int n_ctx, n_chunks;
    int64_t n_scored, eval_tokens, calib_tokens;
    size_t calib_docs, eval_docs;
    double ref_ppl;                 /* f32 KV */
    double ref_bits_per_element;    /* 32 */
    bool tables_in_rate;
    qf_analyze_point *points;       /* in method-table order, rates in the order given */
    int n_points;
    int *frontier;                  /* indices into points, by increasing bits */
    int n_frontier;
    qf_analyze_verdict *verdicts;   /* one per method that was asked for */
    int n_verdicts;
    qf_analyze_skip *skipped;       /* points that could not be measured, and why */
    int n_skipped;
    char capture_device[16];        /* "cpu", "cuda", or "" when nothing learned */
    int cross_check_tokens;         /* 0 when not run */
    double cross_check_max_rel_diff;
    double seconds_capture, seconds_reference, seconds;
} qf_analyze_report;

/* Run the analysis. Errors: QF_ERR_ARG (bad params, an unknown method name), the corpus's
 * (QF_ERR_CORPUS_EMPTY when either split is empty, QF_ERR_IO), the model loader's,
 * QF_ERR_CAPTURE_FAILED, QF_ERR_CERTIFY_FAILED (the reference pass, e.g. an evaluation split
 * shorter than 2 * n_ctx tokens), QF_ERR_NOMEM. A point that cannot be measured (e.g. the
 * rotation on a head_dim that is not a power of two, or a learner without enough vectors) is
 * listed in skipped, not an error. rep is filled as far as it got; free it either way. */
QF_API qf_status qf_analyze_run(const qf_analyze_params *p, qf_analyze_report *rep, qf_error *err);
QF_API void qf_analyze_report_free(qf_analyze_report *rep);

/* From rep->points (and tables_in_rate): the Pareto frontier over (rate, mean KLD) - a point
 * is on it when no other point has at most its bits and at most its KLD with one of them
 * strictly smaller - each point's dominated_by / within_noise, and one verdict per method named
 * in `methods` (n of them; methods with no point get "not measured" plus the skip reason).
 * Replaces what was there. QF_ERR_NOMEM only. */
QF_API qf_status qf_analyze_judge(qf_analyze_report *rep, const char *const *methods, int n, qf_error *err);

/* The table, the frontier and the verdicts as text. */
QF_API void qf_analyze_report_print(const qf_analyze_report *rep, FILE *fp);
/* KLD (log scale) vs bits per element: one curve per method, the frontier dashed; atomic. */
QF_API qf_status qf_analyze_write_svg(const qf_analyze_report *rep, const char *path, qf_error *err);

#endif
