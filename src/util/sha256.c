/* sha256.c: SHA-256 of buffers and files through OpenSSL's EVP interface. */
#include <openssl/evp.h>
#include <string.h>

#include "util.h"

void qf_sha256(const void *data, size_t n, uint8_t out[32]) {
    unsigned int len = 32;
    EVP_Digest(data, n, out, &len, EVP_sha256(), NULL);
}

qf_status qf_sha256_file(const char *path, uint8_t out[32], qf_error *err) {
    qf_mapped_file mf;
    qf_status st = qf_map_file(path, &mf, err);
    if (st) return st;
    qf_sha256(mf.data ? (const void *)mf.data : "", mf.size, out);
    qf_unmap_file(&mf);
    return QF_OK;
}

void qf_hex(const uint8_t *bytes, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}
