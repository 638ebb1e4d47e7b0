/* package.c: the forge's last stage: frame a certified (certificate, payload) as a .qfa
 * (header, canonical CBOR body from the engine's encoder, checksum, optional Ed25519
 * signature) and write it atomically. Layout: docs/artifact-format.md. */
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/artifact.h"
#include "util/util.h"

#define HEADER_BYTES 20
#define SIG_BLOCK_BYTES 96

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The PEM Ed25519 private key at path, or NULL with the error (QF_ERR_IO: cannot open;
 * QF_ERR_ARG: not a PEM Ed25519 private key). Free with EVP_PKEY_free. */
static EVP_PKEY *read_sign_key(const char *path, qf_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        qf_fail(err, QF_ERR_IO, "%s: cannot open signing key", path);
        return NULL;
    }
    EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!k || EVP_PKEY_id(k) != EVP_PKEY_ED25519) {
        EVP_PKEY_free(k);
        qf_fail(err, QF_ERR_ARG, "%s: signing key: expected a PEM Ed25519 private key", path);
        return NULL;
    }
    return k;
}

qf_status qf_sign_key_check(const char *path, qf_error *err) {
    EVP_PKEY *k = read_sign_key(path, err);
    if (!k) return err ? err->code : QF_ERR_ARG;
    EVP_PKEY_free(k);
    return QF_OK;
}

/* Sign msg with the PEM Ed25519 private key at path; out = public key (32) + signature (64). */
static qf_status sign(const char *path, const uint8_t *msg, size_t n, uint8_t out[SIG_BLOCK_BYTES],
                      qf_error *err) {
    EVP_PKEY *k = read_sign_key(path, err);
    if (!k) return err ? err->code : QF_ERR_ARG;
    size_t pub_len = 32, sig_len = 64;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_PKEY_get_raw_public_key(k, out, &pub_len) == 1 && pub_len == 32 &&
              EVP_DigestSignInit(ctx, NULL, NULL, NULL, k) == 1 &&
              EVP_DigestSign(ctx, out + 32, &sig_len, msg, n) == 1 && sig_len == 64;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(k);
    if (!ok) return qf_fail(err, QF_ERR_PACKAGE_FAILED, "%s: Ed25519 signing failed", path);
    return QF_OK;
}

qf_status qf_artifact_serialize(qf_certificate *cert, const qf_payload *payload,
                                const char *sign_key_path, uint8_t **out, size_t *out_len,
                                qf_error *err) {
    *out = NULL;
    *out_len = 0;
    uint8_t *body;
    size_t body_len;
    qf_status st = qf_artifact_encode_body(cert, payload, &body, &body_len, err);
    if (st != QF_OK) return st;

    size_t sig_len = sign_key_path ? SIG_BLOCK_BYTES : 0;
    size_t signed_len = HEADER_BYTES + body_len;
    size_t total = signed_len + 32 + 4 + sig_len;
    uint8_t *buf = malloc(total);
    if (!buf) {
        free(body);
        return qf_fail(err, QF_ERR_NOMEM, "artifact: out of memory for %zu bytes", total);
    }
    memcpy(buf, QF_ARTIFACT_MAGIC, 8); /* the literal's NUL is the 8th byte */
    put_le(buf + 8, QF_ARTIFACT_VERSION, 4);
    put_le(buf + 12, body_len, 8);
    memcpy(buf + HEADER_BYTES, body, body_len);
    free(body);
    qf_sha256(buf, signed_len, buf + signed_len);
    put_le(buf + signed_len + 32, sig_len, 4);
    if (sign_key_path) {
        st = sign(sign_key_path, buf, signed_len, buf + signed_len + 36, err);
        if (st != QF_OK) {
            free(buf);
            return st;
        }
    }
    *out = buf;
    *out_len = total;
    return QF_OK;
}

qf_status qf_artifact_package(const char *path, qf_certificate *cert, const qf_payload *payload,
                              const char *sign_key_path, qf_error *err) {
    if (!cert->passed || !qf_certificate_meets_gate(cert))
        return qf_fail(err, QF_ERR_PACKAGE_FAILED,
                       "%s: refusing to package: the certificate did not pass its gate "
                       "(delta_ppl %.6g, max %.6g)", path, cert->delta_ppl, cert->gate_max_delta_ppl);
    uint8_t *buf;
    size_t n;
    qf_status st = qf_artifact_serialize(cert, payload, sign_key_path, &buf, &n, err);
    if (st != QF_OK) return st;
    st = qf_write_file_atomic(path, buf, n, err);
    free(buf);
    return st;
}
