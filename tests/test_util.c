/* test_util.c: the util layer: f16/bf16 conversion, atomic writes, SHA-256, the pool. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "util/util.h"

TEST(f16_roundtrip_all_finite) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 10) & 0x1f) == 0x1f) continue; /* inf/nan */
        float f = qf_f16_to_f32((uint16_t)h);
        if (qf_f32_to_f16(f) != h && !(f == 0.0f)) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(qf_f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ_INT(qf_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(qf_f32_to_f16(1e6f), 0x7c00);
    CHECK_NEAR(qf_f16_to_f32(0x0001), 5.960464477539063e-08, 1e-15);
    /* ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 */
    CHECK_EQ_INT(qf_f32_to_f16(1.0f + 0.00048828125f), 0x3c00);
    CHECK_EQ_INT(qf_f32_to_bf16(1.0f), 0x3f80);
    CHECK_NEAR(qf_bf16_to_f32(0x3f80), 1.0, 0);
}

TEST(sha256_known_vector) {
    uint8_t d[32];
    char hex[65];
    qf_sha256("abc", 3, d);
    qf_hex(d, 32, hex);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
}

TEST(atomic_write_and_abort) {
    char path[512];
    snprintf(path, sizeof path, "%s/out.bin", test_tmpdir());
    qf_error e;
    CHECK(qf_write_file_atomic(path, "hello", 5, &e) == QF_OK);
    char *buf;
    size_t n;
    CHECK(qf_read_file(path, &buf, &n, &e) == QF_OK);
    CHECK(n == 5 && memcmp(buf, "hello", 5) == 0);
    free(buf);
    qf_atomic_file af;
    CHECK(qf_atomic_open(&af, path, &e) == QF_OK);
    CHECK(qf_atomic_write(&af, "partial", 7, &e) == QF_OK);
    qf_atomic_abort(&af);
    CHECK(qf_read_file(path, &buf, &n, &e) == QF_OK);
    CHECK(n == 5 && memcmp(buf, "hello", 5) == 0); /* old content intact */
    free(buf);
    CHECK(access(af.tmp_path, F_OK) != 0);          /* temp file gone */
}

TEST(atomic_write_disk_full) {
    if (access("/dev/full", W_OK) != 0) SKIP("no /dev/full");
    /* /dev/full as the target directory is impossible; write through a FILE on /dev/full
     * instead to prove the error path reports ENOSPC and leaves nothing behind. */
    qf_atomic_file af;
    qf_error e;
    char path[512];
    snprintf(path, sizeof path, "%s/x.bin", test_tmpdir());
    CHECK(qf_atomic_open(&af, path, &e) == QF_OK);
    fclose(af.fp);
    af.fp = fopen("/dev/full", "wb");
    static char big[1 << 16];
    qf_status st = qf_atomic_write(&af, big, sizeof big, &e);
    if (st == QF_OK) st = qf_atomic_commit(&af, &e);
    CHECK(st == QF_ERR_IO);
    CHECK(strstr(e.msg, "No space") != NULL);
    CHECK(access(path, F_OK) != 0);
}

TEST(read_missing_file) {
    char *buf;
    size_t n;
    qf_error e;
    CHECK(qf_read_file("/nonexistent/qforge", &buf, &n, &e) == QF_ERR_IO);
    CHECK(strstr(e.msg, "/nonexistent/qforge") != NULL);
}

static void add_ith(void *arg, int ith, int nth) {
    int *v = arg;
    __atomic_fetch_add(&v[ith], ith + 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&v[8], nth, __ATOMIC_RELAXED);
}

TEST(pool_runs_every_index) {
    qf_pool *p = qf_pool_create(3);
    CHECK(p != NULL);
    int v[9] = {0};
    for (int r = 0; r < 100; r++) qf_pool_run(p, add_ith, v);
    CHECK_EQ_INT(v[0], 100);
    CHECK_EQ_INT(v[1], 200);
    CHECK_EQ_INT(v[2], 300);
    CHECK_EQ_INT(v[8], 900);
    qf_pool_free(p);
}

TEST(error_names_and_codes) {
    qf_error e;
    CHECK(qf_fail(&e, QF_ERR_CORPUS_EMPTY, "corpus %s is empty", "x") == QF_ERR_CORPUS_EMPTY);
    CHECK(strcmp(qf_status_name(e.code), "CorpusEmpty") == 0);
    CHECK(qf_status_exit_code(QF_OK) == 0);
    for (int a = 1; a < QF_STATUS_COUNT; a++)
        for (int b = a + 1; b < QF_STATUS_COUNT; b++)
            CHECK(qf_status_exit_code(a) != qf_status_exit_code(b));
}

int main(void) {
    RUN(f16_roundtrip_all_finite);
    RUN(sha256_known_vector);
    RUN(atomic_write_and_abort);
    RUN(atomic_write_disk_full);
    RUN(read_missing_file);
    RUN(pool_runs_every_index);
    RUN(error_names_and_codes);
    return test_summary();
}
