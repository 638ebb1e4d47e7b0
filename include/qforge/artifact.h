/* qforge/artifact.h: the .qfa compression artifact: its certificate (provenance, measured
 * quality, the gate it passed), its payload, the forge's packager and the engine's loader.
 *
 * A .qfa is a small fixed header, a deterministic CBOR body, a SHA-256 over header + body and
 * an optional Ed25519 signature; docs/artifact-format.md has the byte layout and every key.
 * The engine refuses an artifact that is corrupt, of an unknown version, badly signed, made
 * for another model or that did not pass its gate, each with its own status and message.
 *
 * Payload: learners never touch CBOR. They fill a qf_payload, an ordered list of uniquely
 * named entries, each one of
 *   QF_PAYLOAD_F32     float array with a shape (row-major, product of shape = count)
 *   QF_PAYLOAD_U8/I8   byte array with a shape
 *   QF_PAYLOAD_INT     one int64
 *   QF_PAYLOAD_FLOAT   one double
 *   QF_PAYLOAD_STRING  one UTF-8 string
 * e.g. kv-int8: "k_scale" f32 [n_layer, n_head_kv]; kv-dict: "sparsity" int and "k.3" f32
 * [n_atoms, head_dim]; awq: "gguf_sha256" u8 [32] and "gguf_file" string. The same list
 * (scalars only) holds the certificate's config map. */
#ifndef QFORGE_ARTIFACT_H
#define QFORGE_ARTIFACT_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/error.h"

#define QF_ARTIFACT_MAGIC "QFORGEA" /* 8 bytes on disk, with its NUL */
#define QF_ARTIFACT_VERSION 1u
#define QF_ARTIFACT_MAX_DIMS 4

typedef enum { QF_ARTIFACT_KV_INT8 = 0, QF_ARTIFACT_KV_DICT, QF_ARTIFACT_AWQ, QF_ARTIFACT_KV_RQ } qf_artifact_kind;

/* "kv-int8", "kv-dict", "awq", "kv-rq"; parse returns false for anything else. */
QF_API const char *qf_artifact_kind_name(qf_artifact_kind k);
QF_API bool qf_artifact_kind_parse(const char *s, qf_artifact_kind *out);

/* ---- payload ---- */
typedef enum {
    QF_PAYLOAD_F32 = 0,
    QF_PAYLOAD_U8,
    QF_PAYLOAD_I8,
    QF_PAYLOAD_INT,
    QF_PAYLOAD_FLOAT,
    QF_PAYLOAD_STRING,
} qf_payload_type;

typedef struct {
    char *name;
    qf_payload_type type;
    int n_dims;                              /* arrays only (1..QF_ARTIFACT_MAX_DIMS) */
    int64_t shape[QF_ARTIFACT_MAX_DIMS];
    size_t count;                            /* elements of an array; bytes of a string */
    float *f32;                              /* QF_PAYLOAD_F32 */
    uint8_t *bytes;                          /* QF_PAYLOAD_U8 / I8 (I8: cast to int8_t) */
    int64_t i;                               /* QF_PAYLOAD_INT */
    double f;                                /* QF_PAYLOAD_FLOAT */
    char *str;                               /* QF_PAYLOAD_STRING (NUL-terminated) */
} qf_payload_entry;

typedef struct {
    qf_payload_entry *entries;
    size_t n, cap;
} qf_payload; /* zero-initialise; free with qf_payload_free */

/* Each add copies its data. Names are non-empty, at most 255 bytes and unique in the list
 * (QF_ERR_ARG otherwise); for arrays the product of shape must equal the element count. */
QF_API qf_status qf_payload_add_f32(qf_payload *p, const char *name, const float *data, int n_dims,
                             const int64_t *shape, qf_error *err);
QF_API qf_status qf_payload_add_u8(qf_payload *p, const char *name, const uint8_t *data, int n_dims,
                            const int64_t *shape, qf_error *err);
QF_API qf_status qf_payload_add_i8(qf_payload *p, const char *name, const int8_t *data, int n_dims,
                            const int64_t *shape, qf_error *err);
QF_API qf_status qf_payload_add_int(qf_payload *p, const char *name, int64_t v, qf_error *err);
QF_API qf_status qf_payload_add_float(qf_payload *p, const char *name, double v, qf_error *err);
QF_API qf_status qf_payload_add_string(qf_payload *p, const char *name, const char *s, qf_error *err);
QF_API void qf_payload_free(qf_payload *p);

/* Lookup by name: NULL when absent. The typed getters also return NULL (or false) when the
 * entry has another type; *count receives the element count. */
QF_API const qf_payload_entry *qf_payload_get(const qf_payload *p, const char *name);
QF_API const float *qf_payload_get_f32(const qf_payload *p, const char *name, size_t *count);
QF_API const uint8_t *qf_payload_get_bytes(const qf_payload *p, const char *name, size_t *count);
QF_API bool qf_payload_get_int(const qf_payload *p, const char *name, int64_t *out);
QF_API bool qf_payload_get_float(const qf_payload *p, const char *name, double *out);
QF_API const char *qf_payload_get_string(const qf_payload *p, const char *name);
/* True when a and b hold the same entries in the same order: names, types, shapes, values (floats
 * compared bit for bit) and array bytes. */
QF_API bool qf_payload_equal(const qf_payload *a, const qf_payload *b);

/* ---- the gate ----
 * One predicate (qf_gate_judge) decides for the forge's certifier (src/forge/certify.c) and for
 * the loader (qf_artifact_check): what certification passed is exactly what loading accepts.
 * Thresholds by rate (qf_gate_default_for, docs/forge.md "The gate"): a gate with by_rate set
 * takes the kind's / rate's default for every KLD threshold it does not set itself. */
typedef struct {
    double max_delta_ppl; /* (cand - ref) / ref, or its absolute value when two_sided, <= this */
    bool has_max_kld;     /* when set, mean KLD must be <= max_kld */
    double max_kld;
    bool has_min_top1;    /* when set, same-top-1 agreement must be >= min_top1 */
    double min_top1;
    /* since issue 15 (zero = the old one-sided ΔPPL gate, which old certificates keep) */
    bool has_max_kld_p99; /* when set, p99 KLD must be <= max_kld_p99 */
    double max_kld_p99;
    bool two_sided;       /* gate |ΔPPL|: a PPL far BELOW the reference is noise too */
    bool vs_baseline;     /* refuse a mean KLD above the free baseline's at the same rate,
                             measured on the same tokens (q8_0 or q4_0 + hadamard) */
    bool by_rate;         /* unset KLD thresholds come from qf_gate_default_for */
} qf_gate;

/* What the gate judges: one certification's numbers (at one context). */
typedef struct {
    double ref_ppl, cand_ppl, delta_ppl, kld_mean, kld_p99, top1;
    bool has_baseline;        /* the free baseline was measured on the same tokens */
    double baseline_kld_mean;
} qf_gate_numbers;

/* Default thresholds for a kind at a rate (bits per element, every overhead included).
 * KV kinds: >= 6 bits: mean KLD <= 0.002, p99 <= 0.02; >= 3.5 bits: 0.02 / 0.2; below: 0.05 /
 * 0.5; |ΔPPL| <= 5 %; vs_baseline on. awq (a weight artifact, no KV baseline): |ΔPPL| <= 5 %
 * only. Always two_sided; by_rate off (the result is resolved). */
QF_API qf_gate qf_gate_default_for(qf_artifact_kind kind, double bits_per_element);
/* g with its unset KLD thresholds filled from qf_gate_default_for when g->by_rate (a copy
 * of g otherwise); by_rate is cleared in the result. */
QF_API qf_gate qf_gate_resolve(const qf_gate *g, qf_artifact_kind kind, double bits_per_element);
/* THE gate predicate. NaN anywhere fails; reference and candidate PPL must be finite; with
 * vs_baseline the baseline must have been measured (has_baseline) and the candidate's mean
 * KLD must not exceed it. why (may be NULL) receives the first failing condition, or "". */
QF_API bool qf_gate_judge(const qf_gate *g, const qf_gate_numbers *n, char *why, size_t cap);

/* ---- certificate ---- */
typedef struct {
    qf_artifact_kind kind;
    /* the model it was certified for */
    uint8_t model_sha256[32];   /* SHA-256 of the whole GGUF file */
    char model_name[128];       /* general.name */
    char model_arch[32];        /* "llama", "qwen2" */
    /* the corpus and its calibration / evaluation split (disjoint, by document) */
    uint8_t corpus_sha256[32];
    int64_t corpus_docs, calib_docs, eval_docs;
    char split[64];             /* how documents were assigned, e.g. "sha256-mod-10:eval=0" */
    int64_t calib_tokens, eval_tokens; /* tokens used to learn / to certify */
    /* the engine that produced it */
    char engine_version[32];    /* qf_version() */
    char engine_commit[48];     /* qf_git_commit() */
    qf_payload config;          /* learner settings: INT, FLOAT and STRING entries only */
    /* measured on the evaluation split, reference vs candidate (same code path) */
    double ref_ppl, cand_ppl;
    double delta_ppl;           /* (cand - ref) / ref, a fraction: 0.05 = 5% */
    double kld_mean, kld_p99;   /* KL(ref || cand) per token, nats */
    double top1_agreement;      /* fraction of positions whose argmax agrees, 0..1 */
    /* the gate */
    double gate_max_delta_ppl;
    bool gate_has_max_kld;      /* gate on kld_mean when set */
    double gate_max_kld;
    bool gate_has_min_top1;
    double gate_min_top1;
    bool passed;
    char created_utc[32];       /* RFC 3339, "2025-01-31T12:00:00Z" */
    uint8_t payload_sha256[32]; /* over the payload's CBOR bytes; filled by encode and load */
} qf_certificate;

/* Zero the certificate and fill engine_version / engine_commit from this build and
 * created_utc with the current time; everything else is the caller's to fill. */
QF_API void qf_certificate_init(qf_certificate *c, qf_artifact_kind kind);
QF_API void qf_certificate_free(qf_certificate *c); /* frees config */
/* Whether the measured numbers meet the gate (NaN never does): qf_gate_judge on the
 * certificate's gate and numbers (qf_certificate_gate). */
QF_API bool qf_certificate_meets_gate(const qf_certificate *c);
/* The certificate's gate and its primary numbers, including the keys added with issue 15
 * (config "gate.max_kld_p99", "gate.two_sided", "gate.vs_baseline", "baseline.kld_mean");
 * a certificate without them gets the old gate (one-sided ΔPPL, no p99, no baseline). */
QF_API void qf_certificate_gate(const qf_certificate *c, qf_gate *g, qf_gate_numbers *n);
/* The numbers recorded at context n_ctx (config "ctx.<n_ctx>.*"); false when absent. */
QF_API bool qf_certificate_ctx_numbers(const qf_certificate *c, int n_ctx, qf_gate_numbers *n, bool *passed);
/* The contexts the artifact is certified at (config "certified_ctx", e.g. "512,4096"; an
 * older certificate: its "eval_n_ctx"), at most max into out. Returns the count, 0 when
 * unknown, -1 when the list is malformed. */
QF_API int qf_certificate_certified_ctx(const qf_certificate *c, int *out, int max);

/* ---- engine side: read and verify ---- */
typedef struct {
    qf_certificate cert;
    qf_payload payload;
    uint32_t version;
    bool is_signed;
    uint8_t signer_public_key[32]; /* raw Ed25519 key, when is_signed */
    uint8_t file_sha256[32];       /* the stored checksum over header + body */
} qf_artifact;

/* Read and verify a .qfa: magic, version (QF_ERR_ARTIFACT_VERSION), checksum and a strict
 * canonical parse (QF_ERR_ARTIFACT_CORRUPT), model (QF_ERR_ARTIFACT_WRONG_MODEL, skipped when
 * model_sha256 is NULL) and gate (QF_ERR_ARTIFACT_NOT_CERTIFIED). A present signature is
 * always checked against the key embedded with it; with trust_key_path (a PEM Ed25519 public
 * or private key) a signature by exactly that key is required (QF_ERR_ARTIFACT_BAD_SIGNATURE).
 * On success *a is filled (free with qf_artifact_free); on failure it is left empty. */
QF_API qf_status qf_artifact_load(const char *path, const uint8_t *model_sha256,
                           const char *trust_key_path, qf_artifact *a, qf_error *err);

/* The two halves of qf_artifact_load, for tools that print a certificate before judging it:
 * read = integrity and signature only (fills *a on success); check = model and gate. */
QF_API qf_status qf_artifact_read(const char *path, const char *trust_key_path, qf_artifact *a,
                           qf_error *err);
QF_API qf_status qf_artifact_read_mem(const uint8_t *data, size_t n, const char *trust_key_path,
                               qf_artifact *a, qf_error *err);
QF_API qf_status qf_artifact_check(const qf_artifact *a, const uint8_t *model_sha256, qf_error *err);
QF_API void qf_artifact_free(qf_artifact *a);

/* The largest context the artifact is certified at (qf_certificate_certified_ctx), 0 when the
 * certificate does not say. */
QF_API int qf_artifact_max_certified_ctx(const qf_artifact *a);
/* Whether a KV artifact may run at context n_ctx: QF_ERR_ARTIFACT_NOT_CERTIFIED when n_ctx is
 * larger than its largest certified context, unless force (then *forced, which may be NULL, is
 * set so the caller can warn). awq artifacts and certificates without a context pass. */
QF_API qf_status qf_artifact_check_ctx(const qf_artifact *a, int n_ctx, bool force, bool *forced, qf_error *err);

/* Payload lookup on a loaded artifact (see qf_payload_get). */
QF_API const qf_payload_entry *qf_artifact_entry(const qf_artifact *a, const char *name);

/* The deterministic CBOR body for (cert, payload) in a malloc'd buffer; also stores the
 * payload hash into cert->payload_sha256. Shared by the packager and the loader, which
 * re-encodes what it decoded and requires identical bytes. */
QF_API qf_status qf_artifact_encode_body(qf_certificate *cert, const qf_payload *payload,
                                  uint8_t **out, size_t *out_len, qf_error *err);

/* ---- forge side: package ---- */

/* Whether path is a readable PEM Ed25519 private key, as packaging will need it: QF_OK,
 * QF_ERR_IO (cannot open) or QF_ERR_ARG (not such a key). For checks before any work. */
QF_API qf_status qf_sign_key_check(const char *path, qf_error *err);

/* The complete .qfa bytes (malloc'd), signed with sign_key_path (PEM Ed25519 private key)
 * when non-NULL. Does not judge the gate, so tests can build refusable files. */
QF_API qf_status qf_artifact_serialize(qf_certificate *cert, const qf_payload *payload,
                                const char *sign_key_path, uint8_t **out, size_t *out_len,
                                qf_error *err);

/* Package a certified artifact to `path`, atomically (a failure leaves any existing file
 * untouched). Refuses with QF_ERR_PACKAGE_FAILED when the certificate did not pass its
 * gate: a gate failure produces no artifact. */
QF_API qf_status qf_artifact_package(const char *path, qf_certificate *cert, const qf_payload *payload,
                              const char *sign_key_path, qf_error *err);

#endif
