/* fuzz_artifact.c: libFuzzer harness for the .qfa artifact reader (qf_artifact_read_mem:
 * header, version, checksum, signature block, strict canonical CBOR, payload) and the
 * model/gate check. Each input is read twice: as given (exercising the framing and the
 * checksum refusal) and with its SHA-256 recomputed over header + body, so mutations reach the
 * CBOR parser instead of dying at the checksum. An accepted artifact has every payload entry
 * touched end to end. Refusals must carry an artifact status and a message.
 *
 * Seeds: with QF_FUZZ_SEED_DIR set, LLVMFuzzerInitialize writes a valid kv-int8, kv-dict and
 * awq artifact there (made with the packager's own serializer), so a run from an empty
 * directory starts from real files. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/artifact.h"
#include "util/util.h"

static volatile uint64_t sink;

static void write_seed(const char *dir, const char *name, qf_artifact_kind kind) {
    qf_certificate c;
    qf_certificate_init(&c, kind);
    snprintf(c.model_name, sizeof c.model_name, "fuzz");
    snprintf(c.model_arch, sizeof c.model_arch, "llama");
    snprintf(c.split, sizeof c.split, "sha256-mod-10:eval=0");
    c.corpus_docs = 10, c.calib_docs = 8, c.eval_docs = 2, c.calib_tokens = 100, c.eval_tokens = 50;
    c.ref_ppl = 10, c.cand_ppl = 10.1, c.delta_ppl = 0.01, c.kld_mean = 0.001, c.kld_p99 = 0.01;
    c.top1_agreement = 0.99, c.gate_max_delta_ppl = 0.05, c.passed = true;
    qf_payload p = {0};
    qf_error e;
    float sc[12];
    for (int i = 0; i < 12; i++) sc[i] = 0.05f * (float)(i + 1);
    int64_t shape[2] = {6, 2}, ashape[2] = {4, 3};
    if (kind == QF_ARTIFACT_KV_INT8) {
        qf_payload_add_f32(&p, "k_scale", sc, 2, shape, &e);
        qf_payload_add_f32(&p, "v_scale", sc, 2, shape, &e);
    } else if (kind == QF_ARTIFACT_KV_DICT) {
        qf_payload_add_int(&p, "n_atoms", 4, &e);
        qf_payload_add_int(&p, "sparsity", 2, &e);
        qf_payload_add_string(&p, "coef", "f16", &e);
        qf_payload_add_f32(&p, "k.0", sc, 2, ashape, &e);
        qf_payload_add_f32(&p, "v.0", sc, 2, ashape, &e);
        qf_payload_add_float(&p, "lambda", 0.125, &e);
    } else {
        uint8_t sha[32] = {1, 2, 3};
        int64_t n32[1] = {32};
        qf_payload_add_u8(&p, "gguf_sha256", sha, 1, n32, &e);
        qf_payload_add_string(&p, "gguf_file", "m-awq.gguf", &e);
    }
    qf_payload_add_int(&c.config, "bits", 8, &e);
    uint8_t *buf;
    size_t n;
    if (qf_artifact_serialize(&c, &p, NULL, &buf, &n, &e) == QF_OK) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(buf, 1, n, f);
            fclose(f);
        }
        free(buf);
    }
    qf_payload_free(&p);
    qf_certificate_free(&c);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("QF_FUZZ_SEED_DIR");
    if (dir && *dir) {
        write_seed(dir, "seed-kv-int8.qfa", QF_ARTIFACT_KV_INT8);
        write_seed(dir, "seed-kv-dict.qfa", QF_ARTIFACT_KV_DICT);
        write_seed(dir, "seed-awq.qfa", QF_ARTIFACT_AWQ);
    }
    return 0;
}

static void touch(const qf_artifact *a) {
    for (size_t i = 0; i < a->payload.n; i++) {
        const qf_payload_entry *en = &a->payload.entries[i];
        if (!en->name || !*en->name) abort();
        if (qf_artifact_entry(a, en->name) != en) abort(); /* names are unique */
        switch (en->type) {
        case QF_PAYLOAD_F32:
            if (en->count) sink += (uint64_t)(en->f32[0] != 0) + (uint64_t)(en->f32[en->count - 1] != 0);
            break;
        case QF_PAYLOAD_U8:
        case QF_PAYLOAD_I8:
            if (en->count) sink += en->bytes[0] + en->bytes[en->count - 1];
            break;
        case QF_PAYLOAD_STRING:
            if (!en->str || strlen(en->str) != en->count) abort();
            break;
        default: sink += (uint64_t)en->i; break;
        }
        if (en->type <= QF_PAYLOAD_I8) {
            uint64_t prod = 1;
            for (int d = 0; d < en->n_dims; d++) prod *= (uint64_t)en->shape[d];
            if (en->n_dims < 1 || en->n_dims > QF_ARTIFACT_MAX_DIMS || prod != en->count) abort();
        }
    }
    for (size_t i = 0; i < a->cert.config.n; i++)
        if (a->cert.config.entries[i].type <= QF_PAYLOAD_I8) abort(); /* config holds scalars only */
}

static void read_one(const uint8_t *data, size_t size) {
    qf_artifact a;
    qf_error e = {0};
    qf_status st = qf_artifact_read_mem(data, size, NULL, &a, &e);
    if (st != QF_OK) {
        if (!e.msg[0]) abort(); /* every refusal says why */
        return;
    }
    touch(&a);
    st = qf_artifact_check(&a, NULL, &e);
    uint8_t other[32] = {0};
    if (qf_artifact_check(&a, other, &e) == QF_OK && memcmp(a.cert.model_sha256, other, 32) != 0) abort();
    qf_artifact_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_one(data, size);
    /* recompute the checksum so the mutation is judged by the parser, not the hash */
    if (size < 20) return 0;
    uint64_t body = 0;
    for (int i = 0; i < 8; i++) body |= (uint64_t)data[12 + i] << (8 * i);
    if (body > size - 20 || size - 20 - body < 32) return 0;
    uint8_t *copy = malloc(size);
    if (!copy) return 0;
    memcpy(copy, data, size);
    qf_sha256(copy, 20 + body, copy + 20 + body);
    read_one(copy, size);
    free(copy);
    return 0;
}
