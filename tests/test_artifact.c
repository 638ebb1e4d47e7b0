/* test_artifact.c: the .qfa format end to end: round trip of every field, every single-byte
 * flip and every truncation refused, each refusal with its own status, Ed25519 signing,
 * atomic writes, an independent Python/cbor2 decoder, and `qforge verify` exit codes. */
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qforge/artifact.h"
#include "test.h"
#include "util/util.h"

static const float k_scale[6] = {0.5f, 1.25f, -3.0f, 1e-7f, 65504.0f, 0.0f};
static const uint8_t raw_u8[5] = {0, 1, 127, 128, 255};
static const int8_t raw_i8[4] = {-128, -1, 0, 127};

static void fill_cert(qf_certificate *c, qf_payload *p) {
    qf_certificate_init(c, QF_ARTIFACT_KV_DICT);
    for (int i = 0; i < 32; i++) {
        c->model_sha256[i] = (uint8_t)(i * 7 + 1);
        c->corpus_sha256[i] = (uint8_t)(255 - i * 3);
    }
    snprintf(c->model_name, sizeof c->model_name, "qforge-demo-11m");
    snprintf(c->model_arch, sizeof c->model_arch, "llama");
    c->corpus_docs = 80;
    c->calib_docs = 64;
    c->eval_docs = 16;
    snprintf(c->split, sizeof c->split, "sha256-mod-5:eval=0");
    c->calib_tokens = 123456;
    c->eval_tokens = 70000;
    snprintf(c->created_utc, sizeof c->created_utc, "2025-01-31T12:34:56Z");
    qf_payload_add_int(&c->config, "n_atoms", 256, NULL);
    qf_payload_add_int(&c->config, "seed", -42, NULL);
    qf_payload_add_float(&c->config, "lambda", 0.125, NULL);
    qf_payload_add_string(&c->config, "method", "omp+ksvd", NULL);
    c->ref_ppl = 12.5;
    c->cand_ppl = 12.8;
    c->delta_ppl = 0.024;
    c->kld_mean = 0.0123;
    c->kld_p99 = 0.25;
    c->top1_agreement = 0.93;
    c->gate_max_delta_ppl = 0.05;
    c->gate_has_max_kld = true;
    c->gate_max_kld = 0.05;
    c->gate_has_min_top1 = false;
    c->passed = true;
    memset(p, 0, sizeof *p);
    qf_payload_add_f32(p, "k_scale", k_scale, 2, (int64_t[]){2, 3}, NULL);
    qf_payload_add_u8(p, "gguf_sha256", raw_u8, 1, (int64_t[]){5}, NULL);
    qf_payload_add_i8(p, "codes", raw_i8, 2, (int64_t[]){2, 2}, NULL);
    qf_payload_add_f32(p, "empty", NULL, 1, (int64_t[]){0}, NULL);
    qf_payload_add_int(p, "sparsity", 8, NULL);
    qf_payload_add_float(p, "alpha", -0.5, NULL);
    qf_payload_add_string(p, "gguf_file", "model-awq.gguf", NULL);
}

static char *tmp_path(const char *dir, const char *name) {
    static char buf[8][4096];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

TEST(payload_api) {
    qf_payload p = {0};
    qf_error e;
    CHECK(qf_payload_add_int(&p, "a", 1, &e) == QF_OK);
    CHECK(qf_payload_add_int(&p, "a", 2, &e) == QF_ERR_ARG); /* duplicate */
    CHECK(qf_payload_add_int(&p, "", 2, &e) == QF_ERR_ARG);
    CHECK(qf_payload_add_f32(&p, "x", k_scale, 2, (int64_t[]){2, 3}, &e) == QF_OK);
    CHECK(qf_payload_get_f32(&p, "x", NULL) != NULL);
    qf_payload_free(&p);
    /* The element count comes from the shape, so the API checks dims and ranges. */
    CHECK(qf_payload_add_f32(&p, "x", k_scale, 0, (int64_t[]){1}, &e) == QF_ERR_ARG);
    CHECK(qf_payload_add_f32(&p, "x", k_scale, 5, (int64_t[]){1, 1, 1, 1, 1}, &e) == QF_ERR_ARG);
    CHECK(qf_payload_add_f32(&p, "x", k_scale, 1, (int64_t[]){-1}, &e) == QF_ERR_ARG);
    CHECK(qf_payload_add_string(&p, "s", NULL, &e) == QF_ERR_ARG);
    CHECK(p.n == 0);
    CHECK(qf_payload_add_string(&p, "s", "hi", &e) == QF_OK);
    CHECK(qf_payload_get_string(&p, "s") && strcmp(qf_payload_get_string(&p, "s"), "hi") == 0);
    CHECK(qf_payload_get_f32(&p, "s", NULL) == NULL);
    CHECK(qf_payload_get(&p, "nope") == NULL);
    qf_payload_free(&p);
    qf_artifact_kind k;
    CHECK(qf_artifact_kind_parse("kv-int8", &k) && k == QF_ARTIFACT_KV_INT8);
    CHECK(qf_artifact_kind_parse("awq", &k) && k == QF_ARTIFACT_AWQ);
    CHECK(!qf_artifact_kind_parse("kv_int8", &k));
    CHECK(strcmp(qf_artifact_kind_name(QF_ARTIFACT_KV_DICT), "kv-dict") == 0);
}

/* qf_payload_equal: the same entries in the same order; any one field or value that differs,
 * a float's bits included, makes them unequal */
static void mk(qf_payload *p, float x0, const char *str, int64_t rows, const char *last) {
    float x[6] = {x0, 1, 2, 3, 4, 5};
    qf_error e;
    memset(p, 0, sizeof *p);
    CHECK(qf_payload_add_f32(p, "x", x, 2, (int64_t[]){rows, 6 / rows}, &e) == QF_OK);
    CHECK(qf_payload_add_string(p, "s", str, &e) == QF_OK);
    CHECK(qf_payload_add_float(p, "f", 0.5, &e) == QF_OK);
    CHECK(qf_payload_add_int(p, last, 7, &e) == QF_OK);
}
TEST(payload_equal) {
    qf_payload a, b;
    mk(&a, 0.0f, "hi", 2, "n"), mk(&b, 0.0f, "hi", 2, "n");
    CHECK(qf_payload_equal(&a, &b));
    qf_payload_free(&b), mk(&b, -0.0f, "hi", 2, "n"); /* equal as floats, not as bits */
    CHECK(!qf_payload_equal(&a, &b));
    qf_payload_free(&b), mk(&b, 0.0f, "ho", 2, "n");
    CHECK(!qf_payload_equal(&a, &b));
    qf_payload_free(&b), mk(&b, 0.0f, "hi", 3, "n"); /* the same floats, another shape */
    CHECK(!qf_payload_equal(&a, &b));
    qf_payload_free(&b), mk(&b, 0.0f, "hi", 2, "m");
    CHECK(!qf_payload_equal(&a, &b));
    qf_payload_free(&b), mk(&b, 0.0f, "hi", 2, "n");
    b.entries[2].f = 0.25;
    CHECK(!qf_payload_equal(&a, &b));
    qf_payload_free(&b), b = (qf_payload){0};
    CHECK(!qf_payload_equal(&a, &b));
    qf_payload_free(&a);
}

TEST(round_trip_every_field) {
    const char *dir = test_tmpdir();
    const char *path = tmp_path(dir, "a.qfa");
    qf_certificate c;
    qf_payload p;
    fill_cert(&c, &p);
    qf_error e;
    qf_status st = qf_artifact_package(path, &c, &p, NULL, &e);
    CHECK_MSG(st == QF_OK, "%s", e.msg);
    qf_artifact a;
    st = qf_artifact_load(path, c.model_sha256, NULL, &a, &e);
    CHECK_MSG(st == QF_OK, "%s", e.msg);
    if (st == QF_OK) {
        const qf_certificate *r = &a.cert;
        CHECK(a.version == QF_ARTIFACT_VERSION && !a.is_signed);
        CHECK(r->kind == QF_ARTIFACT_KV_DICT);
        CHECK(memcmp(r->model_sha256, c.model_sha256, 32) == 0);
        CHECK(memcmp(r->corpus_sha256, c.corpus_sha256, 32) == 0);
        CHECK(memcmp(r->payload_sha256, c.payload_sha256, 32) == 0);
        CHECK(strcmp(r->model_name, c.model_name) == 0 && strcmp(r->model_arch, "llama") == 0);
        CHECK(r->corpus_docs == 80 && r->calib_docs == 64 && r->eval_docs == 16);
        CHECK(strcmp(r->split, c.split) == 0);
        CHECK(r->calib_tokens == 123456 && r->eval_tokens == 70000);
        CHECK(strcmp(r->engine_version, QF_VERSION) == 0);
        CHECK(strcmp(r->engine_commit, c.engine_commit) == 0 && r->engine_commit[0]);
        CHECK(strcmp(r->created_utc, "2025-01-31T12:34:56Z") == 0);
        CHECK(r->ref_ppl == 12.5 && r->cand_ppl == 12.8 && r->delta_ppl == 0.024);
        CHECK(r->kld_mean == 0.0123 && r->kld_p99 == 0.25 && r->top1_agreement == 0.93);
        CHECK(r->gate_max_delta_ppl == 0.05 && r->gate_has_max_kld && r->gate_max_kld == 0.05);
        CHECK(!r->gate_has_min_top1 && r->passed);
        int64_t iv;
        double fv;
        CHECK(r->config.n == 4);
        CHECK(qf_payload_get_int(&r->config, "n_atoms", &iv) && iv == 256);
        CHECK(qf_payload_get_int(&r->config, "seed", &iv) && iv == -42);
        CHECK(qf_payload_get_float(&r->config, "lambda", &fv) && fv == 0.125);
        CHECK(qf_payload_get_string(&r->config, "method") &&
              strcmp(qf_payload_get_string(&r->config, "method"), "omp+ksvd") == 0);
        CHECK(strcmp(r->config.entries[0].name, "n_atoms") == 0); /* order kept */

        CHECK(a.payload.n == 7);
        size_t n = 0;
        const float *ks = qf_payload_get_f32(&a.payload, "k_scale", &n);
        CHECK(ks && n == 6 && memcmp(ks, k_scale, sizeof k_scale) == 0);
        const qf_payload_entry *en = qf_artifact_entry(&a, "k_scale");
        CHECK(en && en->n_dims == 2 && en->shape[0] == 2 && en->shape[1] == 3);
        const uint8_t *b = qf_payload_get_bytes(&a.payload, "gguf_sha256", &n);
        CHECK(b && n == 5 && memcmp(b, raw_u8, 5) == 0);
        en = qf_artifact_entry(&a, "codes");
        CHECK(en && en->type == QF_PAYLOAD_I8 && en->count == 4 && memcmp(en->bytes, raw_i8, 4) == 0);
        en = qf_artifact_entry(&a, "empty");
        CHECK(en && en->type == QF_PAYLOAD_F32 && en->count == 0 && en->shape[0] == 0);
        CHECK(qf_payload_get_int(&a.payload, "sparsity", &iv) && iv == 8);
        CHECK(qf_payload_get_float(&a.payload, "alpha", &fv) && fv == -0.5);
        CHECK(strcmp(qf_payload_get_string(&a.payload, "gguf_file"), "model-awq.gguf") == 0);
        qf_artifact_free(&a);
    }
    /* Deterministic: the same inputs give the same bytes. */
    uint8_t *b1, *b2;
    size_t n1, n2;
    CHECK(qf_artifact_serialize(&c, &p, NULL, &b1, &n1, &e) == QF_OK);
    CHECK(qf_artifact_serialize(&c, &p, NULL, &b2, &n2, &e) == QF_OK);
    CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);
    /* CBOR text must be UTF-8: a bad model name is refused at packaging, not written. */
    snprintf(c.model_name, sizeof c.model_name, "bad \xff name");
    CHECK(qf_artifact_serialize(&c, &p, NULL, &b1, &n1, &e) == QF_ERR_ARG);
    qf_certificate_free(&c);
    qf_payload_free(&p);
}

/* A small artifact in memory (signed when key is given). */
static uint8_t *small_artifact(size_t *n, bool passed, const char *key) {
    qf_certificate c;
    qf_payload p;
    fill_cert(&c, &p);
    c.passed = passed;
    uint8_t *buf = NULL;
    qf_error e;
    if (qf_artifact_serialize(&c, &p, key, &buf, n, &e) != QF_OK) fprintf(stderr, "  %s\n", e.msg);
    qf_certificate_free(&c);
    qf_payload_free(&p);
    return buf;
}

static void flip_all(const uint8_t *buf, size_t n, const char *trust) {
    uint8_t *m = malloc(n);
    int accepted = 0;
    for (size_t i = 0; i < n; i++) {
        for (int mask = 1; mask <= 0x80; mask <<= 7) { /* 0x01 and 0x80 */
            memcpy(m, buf, n);
            m[i] ^= (uint8_t)mask;
            qf_artifact a;
            qf_error e;
            qf_status st = qf_artifact_read_mem(m, n, trust, &a, &e);
            if (st == QF_OK) {
                accepted++;
                qf_artifact_free(&a);
                fprintf(stderr, "  flip of byte %zu (mask %#x) was accepted\n", i, mask);
            } else {
                CHECK(st == QF_ERR_ARTIFACT_CORRUPT || st == QF_ERR_ARTIFACT_VERSION ||
                      st == QF_ERR_ARTIFACT_BAD_SIGNATURE);
            }
        }
    }
    CHECK_EQ_INT(accepted, 0);
    free(m);
}

TEST(every_byte_flip_refused) {
    size_t n;
    uint8_t *buf = small_artifact(&n, true, NULL);
    CHECK(buf != NULL);
    if (!buf) return;
    qf_artifact a;
    qf_error e;
    CHECK(qf_artifact_read_mem(buf, n, NULL, &a, &e) == QF_OK);
    qf_artifact_free(&a);
    flip_all(buf, n, NULL);
    free(buf);
}

/* The checksum is no secret: a crafted body with a fixed-up checksum reaches the decoder.
 * Every such single-byte change must come back as a clean status (a change to a plain
 * number is a legitimately different, valid file), never a crash or a leak. */
TEST(crafted_bodies_never_crash) {
    size_t n;
    uint8_t *buf = small_artifact(&n, true, NULL);
    if (!buf) return;
    uint64_t body_len = 0;
    for (int k = 7; k >= 0; k--) body_len = body_len << 8 | buf[12 + k];
    uint8_t *m = malloc(n);
    int accepted = 0;
    for (size_t i = 20; i < 20 + body_len; i++) {
        for (int mask = 1; mask <= 0x80; mask <<= 7) {
            memcpy(m, buf, n);
            m[i] ^= (uint8_t)mask;
            qf_sha256(m, 20 + body_len, m + 20 + body_len);
            qf_artifact a;
            qf_error e;
            qf_status st = qf_artifact_read_mem(m, n, NULL, &a, &e);
            if (st == QF_OK) accepted++, qf_artifact_free(&a);
            else CHECK_MSG(st == QF_ERR_ARTIFACT_CORRUPT, "byte %zu: %s", i, e.msg);
        }
    }
    /* Only flips inside float64 values, integers and text contents can still decode. */
    CHECK(accepted < (int)body_len);
    free(m);
    free(buf);
}

TEST(every_truncation_refused) {
    size_t n;
    uint8_t *buf = small_artifact(&n, true, NULL);
    if (!buf) return;
    int accepted = 0;
    for (size_t len = 0; len < n; len++) {
        uint8_t *t = malloc(len ? len : 1); /* exact-size copy so ASan sees any overread */
        memcpy(t, buf, len);
        qf_artifact a;
        qf_error e;
        qf_status st = qf_artifact_read_mem(t, len, NULL, &a, &e);
        if (st == QF_OK) accepted++, qf_artifact_free(&a);
        else CHECK(st == QF_ERR_ARTIFACT_CORRUPT);
        free(t);
    }
    CHECK_EQ_INT(accepted, 0);
    /* A trailing byte is refused too. */
    uint8_t *big = malloc(n + 1);
    memcpy(big, buf, n);
    big[n] = 0;
    qf_artifact a;
    CHECK(qf_artifact_read_mem(big, n + 1, NULL, &a, NULL) == QF_ERR_ARTIFACT_CORRUPT);
    free(big);
    /* An empty file on disk. */
    const char *path = tmp_path(test_tmpdir(), "empty.qfa");
    FILE *f = fopen(path, "wb");
    fclose(f);
    CHECK(qf_artifact_load(path, NULL, NULL, &a, NULL) == QF_ERR_ARTIFACT_CORRUPT);
    free(buf);
}

TEST(wrong_model_refused) {
    const char *path = tmp_path(test_tmpdir(), "a.qfa");
    qf_certificate c;
    qf_payload p;
    fill_cert(&c, &p);
    qf_error e;
    CHECK(qf_artifact_package(path, &c, &p, NULL, &e) == QF_OK);
    uint8_t other[32] = {0xab};
    qf_artifact a;
    qf_status st = qf_artifact_load(path, other, NULL, &a, &e);
    CHECK(st == QF_ERR_ARTIFACT_WRONG_MODEL);
    char want[65], got[65];
    qf_hex(c.model_sha256, 32, want);
    qf_hex(other, 32, got);
    CHECK_MSG(strstr(e.msg, want) && strstr(e.msg, got), "%s", e.msg);
    CHECK(qf_artifact_load(path, NULL, NULL, &a, &e) == QF_OK); /* NULL skips the check */
    qf_artifact_free(&a);
    qf_certificate_free(&c);
    qf_payload_free(&p);
}

TEST(uncertified_refused) {
    const char *dir = test_tmpdir();
    const char *path = tmp_path(dir, "a.qfa");
    size_t n;
    uint8_t *buf = small_artifact(&n, false, NULL);
    qf_error e;
    CHECK(qf_write_file_atomic(path, buf, n, &e) == QF_OK);
    free(buf);
    qf_artifact a;
    qf_status st = qf_artifact_load(path, NULL, NULL, &a, &e);
    CHECK(st == QF_ERR_ARTIFACT_NOT_CERTIFIED);
    CHECK_MSG(strstr(e.msg, "0.024") && strstr(e.msg, "0.05"), "%s", e.msg);

    /* passed = true but numbers over the gate: refused as well. */
    qf_certificate c;
    qf_payload p;
    fill_cert(&c, &p);
    c.kld_mean = 0.5;
    CHECK(qf_artifact_serialize(&c, &p, NULL, &buf, &n, &e) == QF_OK);
    CHECK(qf_write_file_atomic(path, buf, n, &e) == QF_OK);
    free(buf);
    CHECK(qf_artifact_load(path, NULL, NULL, &a, &e) == QF_ERR_ARTIFACT_NOT_CERTIFIED);
    c.kld_mean = NAN;
    CHECK(!qf_certificate_meets_gate(&c));

    /* The packager writes nothing for a failed gate. */
    const char *p2 = tmp_path(dir, "b.qfa");
    c.kld_mean = 0.01;
    c.passed = false;
    CHECK(qf_artifact_package(p2, &c, &p, NULL, &e) == QF_ERR_PACKAGE_FAILED);
    CHECK(!file_exists(p2));
    qf_certificate_free(&c);
    qf_payload_free(&p);
}

TEST(unknown_version_refused) {
    size_t n;
    uint8_t *buf = small_artifact(&n, true, NULL);
    if (!buf) return;
    buf[8] = 99;
    qf_artifact a;
    qf_error e;
    CHECK(qf_artifact_read_mem(buf, n, NULL, &a, &e) == QF_ERR_ARTIFACT_VERSION);
    CHECK_MSG(strstr(e.msg, "99"), "%s", e.msg);
    free(buf);
}

static bool write_key(const char *path, EVP_PKEY *k, bool private) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    int ok = private ? PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL) : PEM_write_PUBKEY(f, k);
    fclose(f);
    return ok == 1;
}

static EVP_PKEY *gen_key(void) {
    EVP_PKEY *k = NULL;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, NULL);
    if (ctx && EVP_PKEY_keygen_init(ctx) == 1) EVP_PKEY_keygen(ctx, &k);
    EVP_PKEY_CTX_free(ctx);
    return k;
}

TEST(signing) {
    const char *dir = test_tmpdir();
    const char *priv = tmp_path(dir, "key.pem"), *pub = tmp_path(dir, "key.pub.pem");
    const char *opub = tmp_path(dir, "other.pub.pem"), *path = tmp_path(dir, "s.qfa");
    const char *upath = tmp_path(dir, "u.qfa");
    EVP_PKEY *k = gen_key(), *o = gen_key();
    CHECK(k && o);
    if (!k || !o) return;
    CHECK(write_key(priv, k, true) && write_key(pub, k, false) && write_key(opub, o, false));

    qf_certificate c;
    qf_payload p;
    fill_cert(&c, &p);
    qf_error e;
    qf_status st = qf_artifact_package(path, &c, &p, priv, &e);
    CHECK_MSG(st == QF_OK, "%s", e.msg);
    CHECK(qf_artifact_package(upath, &c, &p, NULL, &e) == QF_OK);
    qf_artifact a;
    st = qf_artifact_load(path, c.model_sha256, pub, &a, &e);
    CHECK_MSG(st == QF_OK, "%s", e.msg);
    if (st == QF_OK) {
        uint8_t raw[32];
        size_t rl = 32;
        EVP_PKEY_get_raw_public_key(k, raw, &rl);
        CHECK(a.is_signed && memcmp(a.signer_public_key, raw, 32) == 0);
        qf_artifact_free(&a);
    }
    CHECK(qf_artifact_load(path, NULL, priv, &a, &e) == QF_OK); /* a private key PEM works too */
    qf_artifact_free(&a);
    CHECK(qf_artifact_load(path, NULL, NULL, &a, &e) == QF_OK); /* signed, no trust key */
    qf_artifact_free(&a);
    /* Signed by someone else, unsigned, or no such key file. */
    CHECK(qf_artifact_load(path, NULL, opub, &a, &e) == QF_ERR_ARTIFACT_BAD_SIGNATURE);
    CHECK(qf_artifact_load(upath, NULL, pub, &a, &e) == QF_ERR_ARTIFACT_BAD_SIGNATURE);
    CHECK_MSG(strstr(e.msg, "unsigned"), "%s", e.msg);
    CHECK(qf_artifact_load(path, NULL, tmp_path(dir, "nope.pem"), &a, &e) == QF_ERR_IO);
    CHECK(qf_artifact_load(path, NULL, path, &a, &e) == QF_ERR_ARG); /* not a key */
    CHECK(qf_artifact_package(tmp_path(dir, "x.qfa"), &c, &p, pub, &e) == QF_ERR_ARG);
    CHECK(!file_exists(tmp_path(dir, "x.qfa")));

    /* Tampered signature (last byte) with and without the trust key; every other flip too. */
    size_t n;
    uint8_t *buf = small_artifact(&n, true, priv);
    if (buf) {
        buf[n - 1] ^= 1;
        CHECK(qf_artifact_read_mem(buf, n, pub, &a, &e) == QF_ERR_ARTIFACT_BAD_SIGNATURE);
        CHECK(qf_artifact_read_mem(buf, n, NULL, &a, &e) == QF_ERR_ARTIFACT_BAD_SIGNATURE);
        buf[n - 1] ^= 1;
        CHECK(qf_artifact_read_mem(buf, n, pub, &a, &e) == QF_OK);
        qf_artifact_free(&a);
        flip_all(buf, n, pub);
        free(buf);
    }
    EVP_PKEY_free(k);
    EVP_PKEY_free(o);
    qf_certificate_free(&c);
    qf_payload_free(&p);
}

TEST(atomic_writes) {
    const char *dir = test_tmpdir();
    qf_certificate c;
    qf_payload p;
    fill_cert(&c, &p);
    qf_error e;
    /* Parent is a regular file: nothing can be created, nothing is. */
    const char *plain = tmp_path(dir, "plain");
    FILE *f = fopen(plain, "wb");
    fputs("x", f);
    fclose(f);
    const char *bad = tmp_path(dir, "plain/a.qfa");
    CHECK(qf_artifact_package(bad, &c, &p, NULL, &e) == QF_ERR_IO);
    CHECK(!file_exists(bad));

    /* An existing artifact stays byte-identical when a later write fails: a directory in
     * the temp file's place makes the write fail after the target already exists. */
    const char *path = tmp_path(dir, "a.qfa");
    CHECK(qf_write_file_atomic(path, "OLD", 3, &e) == QF_OK);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(mkdir(tmp, 0700) == 0);
    CHECK(qf_artifact_package(path, &c, &p, NULL, &e) == QF_ERR_IO);
    char *got = NULL;
    size_t len = 0;
    CHECK(qf_read_file(path, &got, &len, &e) == QF_OK);
    CHECK(got && len == 3 && memcmp(got, "OLD", 3) == 0);
    free(got);
    rmdir(tmp);
    /* Uncertified over an existing file: untouched as well. */
    c.passed = false;
    CHECK(qf_artifact_package(path, &c, &p, NULL, &e) == QF_ERR_PACKAGE_FAILED);
    CHECK(qf_read_file(path, &got, &len, &e) == QF_OK && len == 3);
    free(got);
    c.passed = true;
    CHECK(qf_artifact_package(path, &c, &p, NULL, &e) == QF_OK);
    qf_artifact a;
    CHECK(qf_artifact_load(path, NULL, NULL, &a, &e) == QF_OK);
    qf_artifact_free(&a);
    qf_certificate_free(&c);
    qf_payload_free(&p);
}

static const char *find_python(void) {
    static const char *cands[] = {"/usr/bin/python3", "python3"};
    for (size_t i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import cbor2' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0) return cands[i];
    }
    return NULL;
}

TEST(independent_cbor_decoder) {
    const char *py = find_python();
    if (!py) SKIP("python3 with cbor2 not found (apt-get install python3-cbor2)");
    if (access("tests/artifact_cbor_check.py", R_OK) != 0)
        SKIP("tests/artifact_cbor_check.py not found (run from the repository root)");
    const char *dir = test_tmpdir();
    const char *path = tmp_path(dir, "a.qfa"), *exp = tmp_path(dir, "expect.json");
    qf_certificate c;
    qf_payload p;
    fill_cert(&c, &p);
    qf_error e;
    CHECK(qf_artifact_package(path, &c, &p, NULL, &e) == QF_OK);
    char ms[65], cs[65], ps[65];
    qf_hex(c.model_sha256, 32, ms);
    qf_hex(c.corpus_sha256, 32, cs);
    qf_hex(c.payload_sha256, 32, ps);
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:s, s:s,"
        " s:{s:i, s:i, s:f, s:s}, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:n, s:b, s:s, s:s}",
        "kind", "kv-dict", "model_sha256", ms, "model_name", c.model_name, "model_arch",
        c.model_arch, "corpus_sha256", cs, "corpus_docs", (json_int_t)80, "calib_docs",
        (json_int_t)64, "eval_docs", (json_int_t)16, "split", c.split, "calib_tokens",
        (json_int_t)123456, "eval_tokens", (json_int_t)70000, "engine_version", QF_VERSION,
        "engine_commit", c.engine_commit, "config", "n_atoms", 256, "seed", -42, "lambda", 0.125,
        "method", "omp+ksvd", "ref_ppl", 12.5, "cand_ppl", 12.8, "delta_ppl", 0.024, "kld_mean",
        0.0123, "kld_p99", 0.25, "top1_agreement", 0.93, "max_delta_ppl", 0.05, "max_kld", 0.05,
        "min_top1", "passed", 1, "created_utc", c.created_utc, "payload_sha256", ps);
    CHECK(j != NULL);
    if (j) {
        CHECK(json_dump_file(j, exp, 0) == 0);
        json_decref(j);
        char cmd[9000];
        snprintf(cmd, sizeof cmd, "%s tests/artifact_cbor_check.py %s %s", py, path, exp);
        int rc = system(cmd);
        CHECK_MSG(rc == 0, "artifact_cbor_check.py exited %d", rc);
    }
    qf_certificate_free(&c);
    qf_payload_free(&p);
}

/* `qforge verify`: one exit code per refusal, JSON on request. */
TEST(cli_verify) {
    const char *cli = test_cli();
    if (access(cli, X_OK) != 0) SKIP("CLI not built");
    const char *dir = test_tmpdir();
    const char *ok = tmp_path(dir, "ok.qfa"), *bad = tmp_path(dir, "bad.qfa");
    const char *model = tmp_path(dir, "model.gguf");
    qf_error e;
    CHECK(qf_write_file_atomic(model, "not really a model", 18, &e) == QF_OK);
    uint8_t msha[32];
    CHECK(qf_sha256_file(model, msha, &e) == QF_OK);
    qf_certificate c;
    qf_payload p;
    fill_cert(&c, &p);
    memcpy(c.model_sha256, msha, 32);
    CHECK(qf_artifact_package(ok, &c, &p, NULL, &e) == QF_OK);
    c.passed = false;
    uint8_t *buf;
    size_t n;
    CHECK(qf_artifact_serialize(&c, &p, NULL, &buf, &n, &e) == QF_OK);
    CHECK(qf_write_file_atomic(bad, buf, n, &e) == QF_OK);
    free(buf);
    struct {
        const char *args;
        qf_status want;
    } cases[] = {
        {"%s verify %s >/dev/null", QF_OK},
        {"%s verify %s --json | grep -q '\"passed\": true'", QF_OK},
        /* with -m, verify runs the loader's checks on the model: this "model" is not a GGUF */
        {"%s verify %s -m %s >/dev/null 2>&1", QF_ERR_FORMAT},
        {"%s verify %s -m %s >/dev/null 2>&1", QF_ERR_ARTIFACT_WRONG_MODEL}, /* model = the qfa */
        {"%s verify %s >/dev/null 2>&1", QF_ERR_ARTIFACT_NOT_CERTIFIED},
        {"%s verify %s --trust-key %s >/dev/null 2>&1", QF_ERR_IO},
    };
    const char *a1[] = {ok, ok, ok, ok, bad, ok};
    const char *a2[] = {NULL, NULL, model, ok, NULL, tmp_path(dir, "none.pem")};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[9000];
        snprintf(cmd, sizeof cmd, cases[i].args, cli, a1[i], a2[i]);
        int rc = system(cmd);
        int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
        CHECK_MSG(code == qf_status_exit_code(cases[i].want), "%s: exit %d, want %d", cmd, code,
                  qf_status_exit_code(cases[i].want));
    }
    qf_certificate_free(&c);
    qf_payload_free(&p);
}

int main(void) {
    RUN(payload_api);
    RUN(payload_equal);
    RUN(round_trip_every_field);
    RUN(every_byte_flip_refused);
    RUN(crafted_bodies_never_crash);
    RUN(every_truncation_refused);
    RUN(wrong_model_refused);
    RUN(uncertified_refused);
    RUN(unknown_version_refused);
    RUN(signing);
    RUN(atomic_writes);
    RUN(independent_cbor_decoder);
    RUN(cli_verify);
    return test_summary();
}
