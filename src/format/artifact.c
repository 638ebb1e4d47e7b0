/* artifact.c: the engine side of .qfa artifacts: the payload list, the deterministic CBOR
 * body encoding (shared with the packager), and the loader that verifies a file and refuses
 * what is corrupt, of an unknown version, badly signed, for another model or uncertified.
 * Byte layout and keys: docs/artifact-format.md. Must not depend on src/forge/. */
#include "qforge/artifact.h"
#include "qforge/version.h"

#include <cbor.h>
#include <math.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/util.h"

#define HEADER_BYTES 20 /* magic 8 + version u32 + body length u64 */
#define SIG_BLOCK_BYTES 96 /* Ed25519 public key 32 + signature 64 */
#define MAX_DEPTH 16

/* ---- kinds ---- */
static const char *const kind_names[] = {"kv-int8", "kv-dict", "awq", "kv-rq"};

const char *qf_artifact_kind_name(qf_artifact_kind k) {
    if ((unsigned)k >= sizeof kind_names / sizeof kind_names[0]) return "unknown";
    return kind_names[k];
}

bool qf_artifact_kind_parse(const char *s, qf_artifact_kind *out) {
    for (size_t i = 0; i < sizeof kind_names / sizeof kind_names[0]; i++)
        if (s && strcmp(s, kind_names[i]) == 0) {
            *out = (qf_artifact_kind)i;
            return true;
        }
    return false;
}

/* ---- payload list ---- */
static const char *const type_names[] = {"f32", "u8", "i8", "int", "float", "string"};

static qf_payload_entry *payload_new(qf_payload *p, const char *name, qf_payload_type type,
                                     qf_error *err) {
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > 255)
        return qf_fail(err, QF_ERR_ARG, "payload: name: expected 1..255 bytes, got %zu", len),
               NULL;
    if (qf_payload_get(p, name))
        return qf_fail(err, QF_ERR_ARG, "payload: '%s': duplicate entry name", name), NULL;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        qf_payload_entry *e = realloc(p->entries, cap * sizeof *e);
        if (!e) return qf_fail(err, QF_ERR_NOMEM, "payload: out of memory"), NULL;
        p->entries = e;
        p->cap = cap;
    }
    qf_payload_entry *e = &p->entries[p->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return qf_fail(err, QF_ERR_NOMEM, "payload: out of memory"), NULL;
    e->type = type;
    p->n++;
    return e;
}

static qf_status payload_add_array(qf_payload *p, const char *name, qf_payload_type type,
                                   const void *data, size_t elem, int n_dims,
                                   const int64_t *shape, qf_error *err) {
    if (n_dims < 1 || n_dims > QF_ARTIFACT_MAX_DIMS || !shape)
        return qf_fail(err, QF_ERR_ARG, "payload: '%s': shape: expected 1..%d dims, got %d",
                       name ? name : "", QF_ARTIFACT_MAX_DIMS, n_dims);
    uint64_t count = 1;
    for (int d = 0; d < n_dims; d++) {
        if (shape[d] < 0 || qf_mul_overflow_u64(count, (uint64_t)shape[d], &count) ||
            count > SIZE_MAX / 8)
            return qf_fail(err, QF_ERR_ARG, "payload: '%s': shape[%d] = %lld is out of range",
                           name ? name : "", d, (long long)shape[d]);
    }
    if (count && !data)
        return qf_fail(err, QF_ERR_ARG, "payload: '%s': data is NULL", name ? name : "");
    void *copy = malloc(count ? count * elem : 1);
    if (!copy) return qf_fail(err, QF_ERR_NOMEM, "payload: '%s': out of memory", name);
    if (count) memcpy(copy, data, count * elem);
    qf_payload_entry *e = payload_new(p, name, type, err);
    if (!e) {
        free(copy);
        return err ? err->code : QF_ERR_ARG;
    }
    e->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) e->shape[d] = shape[d];
    e->count = (size_t)count;
    if (type == QF_PAYLOAD_F32) e->f32 = copy;
    else e->bytes = copy;
    return QF_OK;
}

qf_status qf_payload_add_f32(qf_payload *p, const char *name, const float *data, int n_dims,
                             const int64_t *shape, qf_error *err) {
    return payload_add_array(p, name, QF_PAYLOAD_F32, data, 4, n_dims, shape, err);
}
qf_status qf_payload_add_u8(qf_payload *p, const char *name, const uint8_t *data, int n_dims,
                            const int64_t *shape, qf_error *err) {
    return payload_add_array(p, name, QF_PAYLOAD_U8, data, 1, n_dims, shape, err);
}
qf_status qf_payload_add_i8(qf_payload *p, const char *name, const int8_t *data, int n_dims,
                            const int64_t *shape, qf_error *err) {
    return payload_add_array(p, name, QF_PAYLOAD_I8, data, 1, n_dims, shape, err);
}

qf_status qf_payload_add_int(qf_payload *p, const char *name, int64_t v, qf_error *err) {
    qf_payload_entry *e = payload_new(p, name, QF_PAYLOAD_INT, err);
    if (!e) return err ? err->code : QF_ERR_ARG;
    e->i = v;
    return QF_OK;
}

qf_status qf_payload_add_float(qf_payload *p, const char *name, double v, qf_error *err) {
    qf_payload_entry *e = payload_new(p, name, QF_PAYLOAD_FLOAT, err);
    if (!e) return err ? err->code : QF_ERR_ARG;
    e->f = v;
    return QF_OK;
}

qf_status qf_payload_add_string(qf_payload *p, const char *name, const char *s, qf_error *err) {
    if (!s) return qf_fail(err, QF_ERR_ARG, "payload: '%s': string is NULL", name ? name : "");
    char *copy = strdup(s);
    if (!copy) return qf_fail(err, QF_ERR_NOMEM, "payload: out of memory");
    qf_payload_entry *e = payload_new(p, name, QF_PAYLOAD_STRING, err);
    if (!e) {
        free(copy);
        return err ? err->code : QF_ERR_ARG;
    }
    e->str = copy;
    e->count = strlen(copy);
    return QF_OK;
}

void qf_payload_free(qf_payload *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) {
        free(p->entries[i].name);
        free(p->entries[i].f32);
        free(p->entries[i].bytes);
        free(p->entries[i].str);
    }
    free(p->entries);
    memset(p, 0, sizeof *p);
}

const qf_payload_entry *qf_payload_get(const qf_payload *p, const char *name) {
    if (!p || !name) return NULL;
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->entries[i].name, name) == 0) return &p->entries[i];
    return NULL;
}

const float *qf_payload_get_f32(const qf_payload *p, const char *name, size_t *count) {
    const qf_payload_entry *e = qf_payload_get(p, name);
    if (!e || e->type != QF_PAYLOAD_F32) return NULL;
    if (count) *count = e->count;
    return e->f32;
}

const uint8_t *qf_payload_get_bytes(const qf_payload *p, const char *name, size_t *count) {
    const qf_payload_entry *e = qf_payload_get(p, name);
    if (!e || (e->type != QF_PAYLOAD_U8 && e->type != QF_PAYLOAD_I8)) return NULL;
    if (count) *count = e->count;
    return e->bytes;
}

bool qf_payload_get_int(const qf_payload *p, const char *name, int64_t *out) {
    const qf_payload_entry *e = qf_payload_get(p, name);
    if (!e || e->type != QF_PAYLOAD_INT) return false;
    *out = e->i;
    return true;
}

bool qf_payload_get_float(const qf_payload *p, const char *name, double *out) {
    const qf_payload_entry *e = qf_payload_get(p, name);
    if (!e || e->type != QF_PAYLOAD_FLOAT) return false;
    *out = e->f;
    return true;
}

const char *qf_payload_get_string(const qf_payload *p, const char *name) {
    const qf_payload_entry *e = qf_payload_get(p, name);
    return e && e->type == QF_PAYLOAD_STRING ? e->str : NULL;
}

bool qf_payload_equal(const qf_payload *a, const qf_payload *b) {
    if (a->n != b->n) return false;
    for (size_t i = 0; i < a->n; i++) {
        const qf_payload_entry *x = &a->entries[i], *y = &b->entries[i];
        size_t elem = x->type == QF_PAYLOAD_F32 ? sizeof(float) : 1;
        const void *dx = x->f32 ? (const void *)x->f32 : x->bytes ? (const void *)x->bytes : x->str;
        const void *dy = y->f32 ? (const void *)y->f32 : y->bytes ? (const void *)y->bytes : y->str;
        if (strcmp(x->name, y->name) || x->type != y->type || x->n_dims != y->n_dims || x->count != y->count ||
            memcmp(x->shape, y->shape, sizeof x->shape) || x->i != y->i || memcmp(&x->f, &y->f, sizeof x->f) ||
            (!dx) != (!dy) || (dx && memcmp(dx, dy, x->count * elem)))
            return false;
    }
    return true;
}

/* ---- certificate ---- */
void qf_certificate_init(qf_certificate *c, qf_artifact_kind kind) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    snprintf(c->engine_version, sizeof c->engine_version, "%s", qf_version());
    snprintf(c->engine_commit, sizeof c->engine_commit, "%s", qf_git_commit());
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(c->created_utc, sizeof c->created_utc, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void qf_certificate_free(qf_certificate *c) {
    if (c) qf_payload_free(&c->config);
}

bool qf_certificate_meets_gate(const qf_certificate *c) {
    qf_gate g;
    qf_gate_numbers n;
    qf_certificate_gate(c, &g, &n);
    return qf_gate_judge(&g, &n, NULL, 0);
}

/* CBOR text must be UTF-8 (RFC 8949 3.1); a reader such as cbor2 rejects anything else. */
static bool text_ok(const char *s) { return qf_utf8_valid(s, strlen(s)); }

/* ---- encoding ----
 * Deterministic by construction: definite lengths, map keys in the fixed order below,
 * integers in their shortest form, every float as float64, arrays as little-endian bstr. */
static cbor_item_t *enc_int(int64_t v) {
    uint64_t u = v >= 0 ? (uint64_t)v : (uint64_t)(-(v + 1));
    if (v >= 0) {
        if (u <= UINT8_MAX) return cbor_build_uint8((uint8_t)u);
        if (u <= UINT16_MAX) return cbor_build_uint16((uint16_t)u);
        if (u <= UINT32_MAX) return cbor_build_uint32((uint32_t)u);
        return cbor_build_uint64(u);
    }
    if (u <= UINT8_MAX) return cbor_build_negint8((uint8_t)u);
    if (u <= UINT16_MAX) return cbor_build_negint16((uint16_t)u);
    if (u <= UINT32_MAX) return cbor_build_negint32((uint32_t)u);
    return cbor_build_negint64(u);
}

/* Add key -> val to map, consuming val (NULL val = an earlier allocation failed). */
static bool put(cbor_item_t *map, const char *key, cbor_item_t *val) {
    cbor_item_t *k = cbor_build_string(key);
    bool ok = map && k && val && cbor_map_add(map, (struct cbor_pair){.key = k, .value = val});
    if (k) cbor_decref(&k);
    if (val) cbor_decref(&val);
    return ok;
}

static bool push(cbor_item_t *arr, cbor_item_t *val) {
    bool ok = arr && val && cbor_array_push(arr, val);
    if (val) cbor_decref(&val);
    return ok;
}

static cbor_item_t *enc_f32_bytes(const float *x, size_t n) {
    uint8_t *b = malloc(n * 4 + 1);
    if (!b) return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        for (int k = 0; k < 4; k++) b[i * 4 + k] = (uint8_t)(u >> (8 * k));
    }
    cbor_item_t *it = cbor_build_bytestring(b, n * 4);
    free(b);
    return it;
}

static cbor_item_t *enc_hash(const uint8_t h[32]) { return cbor_build_bytestring(h, 32); }

static cbor_item_t *enc_entry(const qf_payload_entry *e) {
    bool is_array = e->type <= QF_PAYLOAD_I8;
    cbor_item_t *m = cbor_new_definite_map(is_array ? 4 : 3);
    bool ok = put(m, "name", cbor_build_string(e->name)) &&
              put(m, "type", cbor_build_string(type_names[e->type]));
    if (ok && is_array) {
        cbor_item_t *shape = cbor_new_definite_array((size_t)e->n_dims);
        for (int d = 0; d < e->n_dims && ok; d++) ok = push(shape, enc_int(e->shape[d]));
        ok = ok ? put(m, "shape", shape) : (shape && (cbor_decref(&shape), 0));
        if (ok)
            ok = put(m, "data", e->type == QF_PAYLOAD_F32 ? enc_f32_bytes(e->f32, e->count)
                                                          : cbor_build_bytestring(e->bytes, e->count));
    } else if (ok) {
        cbor_item_t *v = e->type == QF_PAYLOAD_INT     ? enc_int(e->i)
                         : e->type == QF_PAYLOAD_FLOAT ? cbor_build_float8(e->f)
                                                       : cbor_build_string(e->str);
        ok = put(m, "value", v);
    }
    if (!ok && m) cbor_decref(&m);
    return m;
}

static cbor_item_t *enc_scalar(const qf_payload_entry *e) {
    switch (e->type) {
    case QF_PAYLOAD_INT: return enc_int(e->i);
    case QF_PAYLOAD_FLOAT: return cbor_build_float8(e->f);
    case QF_PAYLOAD_STRING: return cbor_build_string(e->str);
    default: return NULL;
    }
}

static cbor_item_t *enc_opt_float(bool has, double v) {
    return has ? cbor_build_float8(v) : cbor_new_null();
}

static qf_status serialize(cbor_item_t *it, uint8_t **out, size_t *out_len, qf_error *err) {
    unsigned char *buf = NULL;
    size_t cap = 0;
    size_t n = cbor_serialize_alloc(it, &buf, &cap);
    if (n == 0) {
        free(buf);
        return qf_fail(err, QF_ERR_NOMEM, "artifact: body: CBOR serialization failed");
    }
    *out = buf;
    *out_len = n;
    return QF_OK;
}

qf_status qf_artifact_encode_body(qf_certificate *c, const qf_payload *payload, uint8_t **out,
                                  size_t *out_len, qf_error *err) {
    *out = NULL;
    *out_len = 0;
    if ((unsigned)c->kind > QF_ARTIFACT_KV_RQ)
        return qf_fail(err, QF_ERR_ARG, "artifact: kind: expected kv-int8, kv-dict, awq or kv-rq");
    if (c->corpus_docs < 0 || c->calib_docs < 0 || c->eval_docs < 0 || c->calib_tokens < 0 ||
        c->eval_tokens < 0)
        return qf_fail(err, QF_ERR_ARG, "artifact: provenance: document and token counts must be >= 0");
    const char *texts[] = {c->model_name, c->model_arch, c->split, c->engine_version,
                           c->engine_commit, c->created_utc};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        if (!text_ok(texts[i]))
            return qf_fail(err, QF_ERR_ARG, "artifact: provenance: text '%s' is not valid UTF-8", texts[i]);
    const qf_payload *lists[] = {&c->config, payload};
    for (size_t l = 0; l < 2; l++)
        for (size_t i = 0; lists[l] && i < lists[l]->n; i++) {
            const qf_payload_entry *e = &lists[l]->entries[i];
            if (!text_ok(e->name) || (e->type == QF_PAYLOAD_STRING && !text_ok(e->str)))
                return qf_fail(err, QF_ERR_ARG, "artifact: %s: entry '%s': name or value is not valid UTF-8",
                               l ? "payload" : "config", e->name);
        }
    for (size_t i = 0; i < c->config.n; i++)
        if (c->config.entries[i].type < QF_PAYLOAD_INT)
            return qf_fail(err, QF_ERR_ARG, "artifact: config: '%s': expected an int, float or string",
                           c->config.entries[i].name);

    /* The payload is encoded on its own first: its bytes are what payload_sha256 covers. */
    qf_payload empty = {0};
    if (!payload) payload = &empty;
    cbor_item_t *pl = cbor_new_definite_array(payload->n);
    bool ok = pl != NULL;
    for (size_t i = 0; i < payload->n && ok; i++) ok = push(pl, enc_entry(&payload->entries[i]));
    if (!ok) {
        if (pl) cbor_decref(&pl);
        return qf_fail(err, QF_ERR_NOMEM, "artifact: payload: out of memory while encoding");
    }
    uint8_t *pl_bytes = NULL;
    size_t pl_len = 0;
    qf_status st = serialize(pl, &pl_bytes, &pl_len, err);
    if (st != QF_OK) {
        cbor_decref(&pl);
        return st;
    }
    qf_sha256(pl_bytes, pl_len, c->payload_sha256);
    free(pl_bytes);

    cbor_item_t *prov = cbor_new_definite_map(13);
    ok = put(prov, "model_sha256", enc_hash(c->model_sha256)) &&
         put(prov, "model_name", cbor_build_string(c->model_name)) &&
         put(prov, "model_arch", cbor_build_string(c->model_arch)) &&
         put(prov, "corpus_sha256", enc_hash(c->corpus_sha256)) &&
         put(prov, "corpus_docs", enc_int(c->corpus_docs)) &&
         put(prov, "calib_docs", enc_int(c->calib_docs)) &&
         put(prov, "eval_docs", enc_int(c->eval_docs)) &&
         put(prov, "split", cbor_build_string(c->split)) &&
         put(prov, "calib_tokens", enc_int(c->calib_tokens)) &&
         put(prov, "eval_tokens", enc_int(c->eval_tokens)) &&
         put(prov, "engine_version", cbor_build_string(c->engine_version)) &&
         put(prov, "engine_commit", cbor_build_string(c->engine_commit));
    cbor_item_t *cfg = cbor_new_definite_map(c->config.n);
    for (size_t i = 0; i < c->config.n && ok; i++)
        ok = put(cfg, c->config.entries[i].name, enc_scalar(&c->config.entries[i]));
    ok = ok ? put(prov, "config", cfg) : (cfg && (cbor_decref(&cfg), 0));

    cbor_item_t *met = cbor_new_definite_map(6);
    ok = ok && put(met, "ref_ppl", cbor_build_float8(c->ref_ppl)) &&
         put(met, "cand_ppl", cbor_build_float8(c->cand_ppl)) &&
         put(met, "delta_ppl", cbor_build_float8(c->delta_ppl)) &&
         put(met, "kld_mean", cbor_build_float8(c->kld_mean)) &&
         put(met, "kld_p99", cbor_build_float8(c->kld_p99)) &&
         put(met, "top1_agreement", cbor_build_float8(c->top1_agreement));

    cbor_item_t *gate = cbor_new_definite_map(4);
    ok = ok && put(gate, "max_delta_ppl", cbor_build_float8(c->gate_max_delta_ppl)) &&
         put(gate, "max_kld", enc_opt_float(c->gate_has_max_kld, c->gate_max_kld)) &&
         put(gate, "min_top1", enc_opt_float(c->gate_has_min_top1, c->gate_min_top1)) &&
         put(gate, "passed", cbor_build_bool(c->passed));

    cbor_item_t *body = cbor_new_definite_map(7);
    ok = ok && put(body, "kind", cbor_build_string(qf_artifact_kind_name(c->kind)));
    /* put() consumes its value even on failure, so each sub-map is handed over exactly once. */
    ok = put(body, "provenance", prov) && ok;
    ok = put(body, "metrics", met) && ok;
    ok = put(body, "gate", gate) && ok;
    ok = ok && put(body, "created_utc", cbor_build_string(c->created_utc)) &&
         put(body, "payload_sha256", enc_hash(c->payload_sha256));
    ok = put(body, "payload", pl) && ok;
    if (!ok) {
        if (body) cbor_decref(&body);
        return qf_fail(err, QF_ERR_NOMEM, "artifact: body: out of memory while encoding");
    }
    st = serialize(body, out, out_len, err);
    cbor_decref(&body);
    return st;
}

/* ---- decoding ----
 * A bounded pre-scan first: only definite lengths, no tags, each declared count no larger
 * than the bytes left, limited nesting. That keeps libcbor from allocating for lengths the
 * file cannot hold, and rejects the non-canonical forms early. */
static bool scan_item(const uint8_t *p, size_t n, size_t *pos, int depth) {
    if (depth > MAX_DEPTH || *pos >= n) return false;
    uint8_t ib = p[(*pos)++];
    int major = ib >> 5, info = ib & 31;
    uint64_t v = (uint64_t)info;
    if (info >= 24 && info <= 27) {
        size_t len = (size_t)1 << (info - 24);
        if (n - *pos < len) return false;
        v = 0;
        for (size_t k = 0; k < len; k++) v = v << 8 | p[(*pos)++];
    } else if (info > 27) {
        return false; /* reserved or indefinite length */
    }
    switch (major) {
    case 0: case 1: return true;
    case 2: case 3:
        if (v > n - *pos) return false;
        *pos += (size_t)v;
        return true;
    case 4: case 5: {
        if (v > n - *pos) return false;
        uint64_t items = major == 5 ? v * 2 : v;
        for (uint64_t k = 0; k < items; k++)
            if (!scan_item(p, n, pos, depth + 1)) return false;
        return true;
    }
    case 7: return info == 20 || info == 21 || info == 22 || info == 27; /* bool, null, f64 */
    default: return false; /* tags */
    }
}

typedef struct {
    qf_error *err;
    const char *src; /* for messages */
} dec;

#define CORRUPT(d, ...) qf_fail((d)->err, QF_ERR_ARTIFACT_CORRUPT, __VA_ARGS__)

/* The value at position idx of a map whose keys come in a fixed order, or NULL. */
static cbor_item_t *field(const cbor_item_t *map, size_t idx, const char *key) {
    if (!map || !cbor_isa_map(map) || idx >= cbor_map_size(map)) return NULL;
    struct cbor_pair *pr = &cbor_map_handle(map)[idx];
    size_t kl = strlen(key);
    if (!cbor_isa_string(pr->key) || !cbor_string_is_definite(pr->key) ||
        cbor_string_length(pr->key) != kl || memcmp(cbor_string_handle(pr->key), key, kl) != 0)
        return NULL;
    return pr->value;
}

static bool is_map(const cbor_item_t *it, size_t n) {
    return it && cbor_isa_map(it) && cbor_map_is_definite(it) && cbor_map_size(it) == n;
}

static bool get_text(const cbor_item_t *it, char *dst, size_t cap) {
    if (!it || !cbor_isa_string(it) || !cbor_string_is_definite(it)) return false;
    size_t n = cbor_string_length(it);
    if (n >= cap || memchr(cbor_string_handle(it), 0, n) ||
        !qf_utf8_valid((const char *)cbor_string_handle(it), n))
        return false;
    memcpy(dst, cbor_string_handle(it), n);
    dst[n] = '\0';
    return true;
}

static char *dup_text(const cbor_item_t *it) {
    if (!it || !cbor_isa_string(it) || !cbor_string_is_definite(it)) return NULL;
    size_t n = cbor_string_length(it);
    if (memchr(cbor_string_handle(it), 0, n) || !qf_utf8_valid((const char *)cbor_string_handle(it), n))
        return NULL;
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, cbor_string_handle(it), n);
    s[n] = '\0';
    return s;
}

static bool get_int(const cbor_item_t *it, int64_t *out) {
    if (!it) return false;
    if (cbor_isa_uint(it)) {
        uint64_t u = cbor_get_int(it);
        if (u > INT64_MAX) return false;
        *out = (int64_t)u;
        return true;
    }
    if (cbor_isa_negint(it)) {
        uint64_t u = cbor_get_int(it);
        if (u > INT64_MAX) return false;
        *out = -(int64_t)u - 1;
        return true;
    }
    return false;
}

static bool get_count(const cbor_item_t *it, int64_t *out) {
    return it && cbor_isa_uint(it) && get_int(it, out);
}

static bool is_f64(const cbor_item_t *it) {
    return it && cbor_isa_float_ctrl(it) && cbor_float_get_width(it) == CBOR_FLOAT_64;
}

static bool get_f64(const cbor_item_t *it, double *out) {
    if (!is_f64(it)) return false;
    *out = cbor_float_get_float8(it);
    return true;
}

/* libcbor asserts when a control-value query meets a float, so check the width first. */
static bool is_ctrl(const cbor_item_t *it) {
    return it && cbor_isa_float_ctrl(it) && cbor_float_get_width(it) == CBOR_FLOAT_0;
}

static bool get_opt_f64(const cbor_item_t *it, bool *has, double *out) {
    if (is_ctrl(it) && cbor_is_null(it)) {
        *has = false;
        *out = 0;
        return true;
    }
    *has = true;
    return get_f64(it, out);
}

static bool get_hash(const cbor_item_t *it, uint8_t out[32]) {
    if (!it || !cbor_isa_bytestring(it) || !cbor_bytestring_is_definite(it) ||
        cbor_bytestring_length(it) != 32)
        return false;
    memcpy(out, cbor_bytestring_handle(it), 32);
    return true;
}

static qf_status dec_entry(dec *d, const cbor_item_t *it, size_t idx, qf_payload *p) {
    if (!it || !cbor_isa_map(it) || !cbor_map_is_definite(it))
        return CORRUPT(d, "%s: payload[%zu]: expected a map", d->src, idx);
    char name[256], type[16];
    if (!get_text(field(it, 0, "name"), name, sizeof name) || !name[0])
        return CORRUPT(d, "%s: payload[%zu].name: expected a text of 1..255 bytes", d->src, idx);
    if (!get_text(field(it, 1, "type"), type, sizeof type))
        return CORRUPT(d, "%s: payload '%s'.type: expected a text", d->src, name);
    int t = -1;
    for (int k = 0; k < (int)(sizeof type_names / sizeof type_names[0]); k++)
        if (strcmp(type, type_names[k]) == 0) t = k;
    if (t < 0)
        return CORRUPT(d, "%s: payload '%s'.type: unknown type '%s'", d->src, name, type);
    qf_error sub;
    qf_status st;
    if (t <= QF_PAYLOAD_I8) {
        const cbor_item_t *shape = field(it, 2, "shape"), *data = field(it, 3, "data");
        if (cbor_map_size(it) != 4 || !shape || !cbor_isa_array(shape) ||
            cbor_array_size(shape) < 1 || cbor_array_size(shape) > QF_ARTIFACT_MAX_DIMS)
            return CORRUPT(d, "%s: payload '%s'.shape: expected an array of 1..%d uints",
                           d->src, name, QF_ARTIFACT_MAX_DIMS);
        int64_t dims[QF_ARTIFACT_MAX_DIMS];
        int nd = (int)cbor_array_size(shape);
        uint64_t count = 1;
        for (int k = 0; k < nd; k++)
            if (!get_count(cbor_array_handle(shape)[k], &dims[k]) ||
                qf_mul_overflow_u64(count, (uint64_t)dims[k], &count) || count > SIZE_MAX / 8)
                return CORRUPT(d, "%s: payload '%s'.shape[%d]: expected a uint in range",
                               d->src, name, k);
        size_t elem = t == QF_PAYLOAD_F32 ? 4 : 1;
        if (!data || !cbor_isa_bytestring(data) || !cbor_bytestring_is_definite(data) ||
            cbor_bytestring_length(data) != count * elem)
            return CORRUPT(d, "%s: payload '%s'.data: expected a bstr of %llu bytes", d->src,
                           name, (unsigned long long)(count * elem));
        const uint8_t *b = cbor_bytestring_handle(data);
        if (t == QF_PAYLOAD_F32) {
            float *x = malloc(count ? count * 4 : 1);
            if (!x) return qf_fail(d->err, QF_ERR_NOMEM, "%s: payload '%s': out of memory", d->src, name);
            for (size_t i = 0; i < count; i++) {
                uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                             (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
                memcpy(&x[i], &u, 4);
            }
            st = qf_payload_add_f32(p, name, x, nd, dims, &sub);
            free(x);
        } else {
            st = payload_add_array(p, name, (qf_payload_type)t, b, 1, nd, dims, &sub);
        }
    } else {
        const cbor_item_t *v = field(it, 2, "value");
        if (cbor_map_size(it) != 3 || !v)
            return CORRUPT(d, "%s: payload '%s': expected keys name, type, value", d->src, name);
        int64_t iv;
        double fv;
        char *s;
        if (t == QF_PAYLOAD_INT) {
            if (!get_int(v, &iv)) return CORRUPT(d, "%s: payload '%s'.value: expected an int", d->src, name);
            st = qf_payload_add_int(p, name, iv, &sub);
        } else if (t == QF_PAYLOAD_FLOAT) {
            if (!get_f64(v, &fv)) return CORRUPT(d, "%s: payload '%s'.value: expected a float64", d->src, name);
            st = qf_payload_add_float(p, name, fv, &sub);
        } else {
            if (!(s = dup_text(v))) return CORRUPT(d, "%s: payload '%s'.value: expected a text", d->src, name);
            st = qf_payload_add_string(p, name, s, &sub);
            free(s);
        }
    }
    if (st == QF_ERR_NOMEM) return qf_fail(d->err, st, "%s: %s", d->src, sub.msg);
    if (st != QF_OK) return CORRUPT(d, "%s: %s", d->src, sub.msg);
    return QF_OK;
}

static qf_status dec_config(dec *d, const cbor_item_t *it, qf_payload *cfg) {
    if (!it || !cbor_isa_map(it) || !cbor_map_is_definite(it))
        return CORRUPT(d, "%s: provenance.config: expected a map", d->src);
    for (size_t i = 0; i < cbor_map_size(it); i++) {
        struct cbor_pair *pr = &cbor_map_handle(it)[i];
        char key[256];
        if (!get_text(pr->key, key, sizeof key) || !key[0])
            return CORRUPT(d, "%s: provenance.config: key %zu: expected a text of 1..255 bytes", d->src, i);
        qf_error sub;
        qf_status st;
        int64_t iv;
        double fv;
        char *s;
        if (get_int(pr->value, &iv)) st = qf_payload_add_int(cfg, key, iv, &sub);
        else if (get_f64(pr->value, &fv)) st = qf_payload_add_float(cfg, key, fv, &sub);
        else if ((s = dup_text(pr->value))) {
            st = qf_payload_add_string(cfg, key, s, &sub);
            free(s);
        } else
            return CORRUPT(d, "%s: provenance.config.%s: expected an int, float64 or text", d->src, key);
        if (st != QF_OK) return CORRUPT(d, "%s: provenance.config: %s", d->src, sub.msg);
    }
    return QF_OK;
}

static qf_status dec_body(dec *d, const cbor_item_t *body, qf_artifact *a) {
    qf_certificate *c = &a->cert;
    if (!is_map(body, 7)) return CORRUPT(d, "%s: body: expected a map of 7 keys", d->src);
    char kind[16];
    if (!get_text(field(body, 0, "kind"), kind, sizeof kind) || !qf_artifact_kind_parse(kind, &c->kind))
        return CORRUPT(d, "%s: kind: expected \"kv-int8\", \"kv-dict\", \"awq\" or \"kv-rq\"", d->src);

    const cbor_item_t *pv = field(body, 1, "provenance");
    if (!is_map(pv, 13)) return CORRUPT(d, "%s: provenance: expected a map of 13 keys", d->src);
    if (!get_hash(field(pv, 0, "model_sha256"), c->model_sha256))
        return CORRUPT(d, "%s: provenance.model_sha256: expected a 32-byte bstr", d->src);
    if (!get_text(field(pv, 1, "model_name"), c->model_name, sizeof c->model_name))
        return CORRUPT(d, "%s: provenance.model_name: expected a text < %zu bytes", d->src, sizeof c->model_name);
    if (!get_text(field(pv, 2, "model_arch"), c->model_arch, sizeof c->model_arch))
        return CORRUPT(d, "%s: provenance.model_arch: expected a text < %zu bytes", d->src, sizeof c->model_arch);
    if (!get_hash(field(pv, 3, "corpus_sha256"), c->corpus_sha256))
        return CORRUPT(d, "%s: provenance.corpus_sha256: expected a 32-byte bstr", d->src);
    if (!get_count(field(pv, 4, "corpus_docs"), &c->corpus_docs) ||
        !get_count(field(pv, 5, "calib_docs"), &c->calib_docs) ||
        !get_count(field(pv, 6, "eval_docs"), &c->eval_docs))
        return CORRUPT(d, "%s: provenance.corpus_docs/calib_docs/eval_docs: expected uints", d->src);
    if (!get_text(field(pv, 7, "split"), c->split, sizeof c->split))
        return CORRUPT(d, "%s: provenance.split: expected a text < %zu bytes", d->src, sizeof c->split);
    if (!get_count(field(pv, 8, "calib_tokens"), &c->calib_tokens) ||
        !get_count(field(pv, 9, "eval_tokens"), &c->eval_tokens))
        return CORRUPT(d, "%s: provenance.calib_tokens/eval_tokens: expected uints", d->src);
    if (!get_text(field(pv, 10, "engine_version"), c->engine_version, sizeof c->engine_version) ||
        !get_text(field(pv, 11, "engine_commit"), c->engine_commit, sizeof c->engine_commit))
        return CORRUPT(d, "%s: provenance.engine_version/engine_commit: expected short texts", d->src);
    qf_status st = dec_config(d, field(pv, 12, "config"), &c->config);
    if (st != QF_OK) return st;

    const cbor_item_t *m = field(body, 2, "metrics");
    if (!is_map(m, 6) || !get_f64(field(m, 0, "ref_ppl"), &c->ref_ppl) ||
        !get_f64(field(m, 1, "cand_ppl"), &c->cand_ppl) ||
        !get_f64(field(m, 2, "delta_ppl"), &c->delta_ppl) ||
        !get_f64(field(m, 3, "kld_mean"), &c->kld_mean) ||
        !get_f64(field(m, 4, "kld_p99"), &c->kld_p99) ||
        !get_f64(field(m, 5, "top1_agreement"), &c->top1_agreement))
        return CORRUPT(d, "%s: metrics: expected ref_ppl, cand_ppl, delta_ppl, kld_mean, kld_p99, "
                          "top1_agreement as float64", d->src);

    const cbor_item_t *g = field(body, 3, "gate"), *passed = field(g, 3, "passed");
    if (!is_map(g, 4) || !get_f64(field(g, 0, "max_delta_ppl"), &c->gate_max_delta_ppl) ||
        !get_opt_f64(field(g, 1, "max_kld"), &c->gate_has_max_kld, &c->gate_max_kld) ||
        !get_opt_f64(field(g, 2, "min_top1"), &c->gate_has_min_top1, &c->gate_min_top1) ||
        !is_ctrl(passed) || !cbor_is_bool(passed))
        return CORRUPT(d, "%s: gate: expected max_delta_ppl float64, max_kld and min_top1 float64 "
                          "or null, passed bool", d->src);
    c->passed = cbor_get_bool(passed);

    if (!get_text(field(body, 4, "created_utc"), c->created_utc, sizeof c->created_utc))
        return CORRUPT(d, "%s: created_utc: expected an RFC 3339 text", d->src);
    uint8_t stored_payload_sha[32];
    if (!get_hash(field(body, 5, "payload_sha256"), stored_payload_sha))
        return CORRUPT(d, "%s: payload_sha256: expected a 32-byte bstr", d->src);
    const cbor_item_t *pl = field(body, 6, "payload");
    if (!pl || !cbor_isa_array(pl) || !cbor_array_is_definite(pl))
        return CORRUPT(d, "%s: payload: expected an array", d->src);
    for (size_t i = 0; i < cbor_array_size(pl); i++)
        if ((st = dec_entry(d, cbor_array_handle(pl)[i], i, &a->payload)) != QF_OK) return st;
    memcpy(c->payload_sha256, stored_payload_sha, 32);
    return QF_OK;
}

/* ---- keys and signatures ---- */
static qf_status load_public_key(const char *path, uint8_t raw[32], qf_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return qf_fail(err, QF_ERR_IO, "%s: cannot open trust key", path);
    EVP_PKEY *k = PEM_read_PUBKEY(f, NULL, NULL, NULL);
    if (!k) {
        rewind(f);
        k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    }
    fclose(f);
    size_t n = 32;
    bool ok = k && EVP_PKEY_id(k) == EVP_PKEY_ED25519 &&
              EVP_PKEY_get_raw_public_key(k, raw, &n) == 1 && n == 32;
    EVP_PKEY_free(k);
    if (!ok)
        return qf_fail(err, QF_ERR_ARG, "%s: trust key: expected a PEM Ed25519 public or private key", path);
    return QF_OK;
}

static bool ed25519_verify(const uint8_t pub[32], const uint8_t *msg, size_t n, const uint8_t sig[64]) {
    EVP_PKEY *k = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, 32);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = k && ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, k) == 1 &&
              EVP_DigestVerify(ctx, sig, 64, msg, n) == 1;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(k);
    return ok;
}

static void hex32(const uint8_t h[32], char out[65]) { qf_hex(h, 32, out); }

/* ---- loading ---- */
static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static qf_status read_mem(const uint8_t *data, size_t n, const char *src, const char *trust_key,
                          qf_artifact *a, qf_error *err) {
    memset(a, 0, sizeof *a);
    dec d = {err, src};
    if (n < 8 || memcmp(data, QF_ARTIFACT_MAGIC, 8) != 0)
        return CORRUPT(&d, "%s: magic: expected \"QFORGEA\\0\" (not a qforge artifact)", src);
    if (n < 12) return CORRUPT(&d, "%s: header: truncated at %zu bytes", src, n);
    uint32_t version = (uint32_t)rd_le(data + 8, 4);
    if (version != QF_ARTIFACT_VERSION)
        return qf_fail(err, QF_ERR_ARTIFACT_VERSION,
                       "%s: format version %u is not supported (this engine reads version %u)",
                       src, version, QF_ARTIFACT_VERSION);
    if (n < HEADER_BYTES) return CORRUPT(&d, "%s: header: truncated at %zu bytes", src, n);
    uint64_t body_len = rd_le(data + 12, 8);
    size_t rest = n - HEADER_BYTES;
    if (body_len > rest || rest - body_len < 32 + 4)
        return CORRUPT(&d, "%s: body length %llu does not fit a %zu-byte file (truncated?)", src,
                       (unsigned long long)body_len, n);
    size_t signed_len = HEADER_BYTES + (size_t)body_len;
    uint8_t digest[32];
    qf_sha256(data, signed_len, digest);
    if (memcmp(digest, data + signed_len, 32) != 0) {
        char want[65], got[65];
        hex32(data + signed_len, want);
        hex32(digest, got);
        return CORRUPT(&d, "%s: checksum mismatch: stored %s, computed %s (file damaged)", src, want, got);
    }
    size_t sig_at = signed_len + 32;
    uint32_t sig_len = (uint32_t)rd_le(data + sig_at, 4);
    if ((sig_len != 0 && sig_len != SIG_BLOCK_BYTES) || n - sig_at - 4 != sig_len)
        return CORRUPT(&d, "%s: signature block: expected 0 or %d bytes ending the file, got length "
                           "%u with %zu bytes left", src, SIG_BLOCK_BYTES, sig_len, n - sig_at - 4);
    const uint8_t *sig_block = data + sig_at + 4;

    /* A present signature is checked even without a trust key, so the signature block is
     * covered against damage like every other byte. */
    if (sig_len) {
        if (!ed25519_verify(sig_block, data, signed_len, sig_block + 32))
            return qf_fail(err, QF_ERR_ARTIFACT_BAD_SIGNATURE,
                           "%s: signature: does not verify against its embedded key", src);
        a->is_signed = true;
        memcpy(a->signer_public_key, sig_block, 32);
    }
    if (trust_key) {
        uint8_t trusted[32];
        qf_status st = load_public_key(trust_key, trusted, err);
        if (st != QF_OK) return st;
        if (!sig_len)
            return qf_fail(err, QF_ERR_ARTIFACT_BAD_SIGNATURE,
                           "%s: signature: unsigned, but a trust key (%s) requires one", src, trust_key);
        if (memcmp(trusted, sig_block, 32) != 0) {
            char want[65], got[65];
            hex32(trusted, want);
            hex32(sig_block, got);
            return qf_fail(err, QF_ERR_ARTIFACT_BAD_SIGNATURE,
                           "%s: signature: signed by key %s, expected trusted key %s", src, got, want);
        }
    }

    const uint8_t *body = data + HEADER_BYTES;
    size_t pos = 0;
    if (!scan_item(body, (size_t)body_len, &pos, 0) || pos != body_len)
        return CORRUPT(&d, "%s: body: not one definite-length CBOR item of the artifact subset", src);
    struct cbor_load_result res;
    cbor_item_t *item = cbor_load(body, (size_t)body_len, &res);
    if (!item || res.error.code != CBOR_ERR_NONE || res.read != body_len) {
        if (item) cbor_decref(&item);
        return CORRUPT(&d, "%s: body: CBOR parse error at byte %zu", src, res.error.position);
    }
    qf_status st = dec_body(&d, item, a);
    cbor_decref(&item);
    if (st != QF_OK) {
        qf_artifact_free(a);
        return st;
    }
    /* Canonical: what we decoded must encode to exactly the stored bytes. This also checks
     * payload_sha256, which the encoder recomputes. */
    uint8_t stored_payload_sha[32];
    memcpy(stored_payload_sha, a->cert.payload_sha256, 32);
    uint8_t *re = NULL;
    size_t re_len = 0;
    st = qf_artifact_encode_body(&a->cert, &a->payload, &re, &re_len, err);
    if (st != QF_OK) {
        qf_artifact_free(a);
        return st;
    }
    bool same = re_len == body_len && memcmp(re, body, re_len) == 0;
    bool payload_ok = memcmp(stored_payload_sha, a->cert.payload_sha256, 32) == 0;
    free(re);
    if (!payload_ok || !same) {
        qf_artifact_free(a);
        return CORRUPT(&d, payload_ok ? "%s: body: not in canonical form (re-encoding differs)"
                                      : "%s: payload_sha256: does not match the payload bytes", src);
    }
    a->version = version;
    memcpy(a->file_sha256, digest, 32);
    return QF_OK;
}

qf_status qf_artifact_read_mem(const uint8_t *data, size_t n, const char *trust_key_path,
                               qf_artifact *a, qf_error *err) {
    return read_mem(data, n, "<memory>", trust_key_path, a, err);
}

qf_status qf_artifact_read(const char *path, const char *trust_key_path, qf_artifact *a,
                           qf_error *err) {
    memset(a, 0, sizeof *a);
    qf_mapped_file mf;
    qf_status st = qf_map_file(path, &mf, err);
    if (st != QF_OK) return st;
    st = read_mem(mf.data ? mf.data : (const uint8_t *)"", mf.size, path, trust_key_path, a, err);
    qf_unmap_file(&mf);
    return st;
}

qf_status qf_artifact_check(const qf_artifact *a, const uint8_t *model_sha256, qf_error *err) {
    const qf_certificate *c = &a->cert;
    if (model_sha256 && memcmp(model_sha256, c->model_sha256, 32) != 0) {
        char want[65], got[65];
        hex32(c->model_sha256, want);
        hex32(model_sha256, got);
        return qf_fail(err, QF_ERR_ARTIFACT_WRONG_MODEL,
                       "artifact was certified for model sha256 %s (%s), but this model is sha256 %s",
                       want, c->model_name, got);
    }
    qf_gate g;
    qf_gate_numbers n;
    qf_certificate_gate(c, &g, &n);
    char gate[256] = "";
    int off = snprintf(gate, sizeof gate, "%sdelta_ppl%s %.6g <= %.6g", g.two_sided ? "|" : "", g.two_sided ? "|" : "",
                       c->delta_ppl, g.max_delta_ppl);
    if (g.has_max_kld)
        off += snprintf(gate + off, sizeof gate - (size_t)off, ", kld_mean %.6g <= %.6g", c->kld_mean, g.max_kld);
    if (g.has_max_kld_p99)
        off += snprintf(gate + off, sizeof gate - (size_t)off, ", kld_p99 %.6g <= %.6g", c->kld_p99, g.max_kld_p99);
    if (g.has_min_top1)
        off += snprintf(gate + off, sizeof gate - (size_t)off, ", top1 %.6g >= %.6g", c->top1_agreement, g.min_top1);
    if (g.vs_baseline)
        snprintf(gate + off, sizeof gate - (size_t)off, ", kld_mean <= baseline's %.6g", n.baseline_kld_mean);
    if (!c->passed)
        return qf_fail(err, QF_ERR_ARTIFACT_NOT_CERTIFIED,
                       "artifact did not pass its gate (passed = false; gate: %s; ref_ppl %.6g, cand_ppl %.6g)",
                       gate, c->ref_ppl, c->cand_ppl);
    char why[256];
    if (!qf_gate_judge(&g, &n, why, sizeof why))
        return qf_fail(err, QF_ERR_ARTIFACT_NOT_CERTIFIED, "artifact claims passed, but its numbers fail its gate: %s (gate: %s)",
                       why, gate);
    /* every other context it claims: its own recorded numbers pass the same gate */
    int ctxs[16];
    int nc = qf_certificate_certified_ctx(c, ctxs, 16);
    if (nc < 0) return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "artifact: config.certified_ctx: expected \"N[,N...]\"");
    for (int i = 0; i < nc; i++) {
        qf_gate_numbers cn;
        bool passed = false;
        if (!qf_certificate_ctx_numbers(c, ctxs[i], &cn, &passed)) {
            if (qf_payload_get_string(&c->config, "certified_ctx"))
                return qf_fail(err, QF_ERR_ARTIFACT_NOT_CERTIFIED,
                               "artifact claims context %d certified but records no numbers for it", ctxs[i]);
            continue; /* an older certificate: its one context is the primary numbers above */
        }
        if (!passed || !qf_gate_judge(&g, &cn, why, sizeof why))
            return qf_fail(err, QF_ERR_ARTIFACT_NOT_CERTIFIED,
                           "artifact claims context %d certified, but its numbers there fail its gate: %s", ctxs[i],
                           passed ? why : "passed = false");
    }
    return QF_OK;
}

qf_status qf_artifact_load(const char *path, const uint8_t *model_sha256,
                           const char *trust_key_path, qf_artifact *a, qf_error *err) {
    qf_status st = qf_artifact_read(path, trust_key_path, a, err);
    if (st != QF_OK) return st;
    st = qf_artifact_check(a, model_sha256, err);
    if (st != QF_OK) {
        qf_error_prefix(err, "%s: ", path);
        qf_artifact_free(a);
    }
    return st;
}

void qf_artifact_free(qf_artifact *a) {
    if (!a) return;
    qf_certificate_free(&a->cert);
    qf_payload_free(&a->payload);
    memset(a, 0, sizeof *a);
}

const qf_payload_entry *qf_artifact_entry(const qf_artifact *a, const char *name) {
    return a ? qf_payload_get(&a->payload, name) : NULL;
}
