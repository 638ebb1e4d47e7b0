/* test_util.c: the util layer: f16/bf16 conversion, atomic writes, SHA-256, the pool. */
#include <stdint.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/* The one strict validator (artifact text, corpus reader): RFC 3629, checked byte by byte
 * against a decoder written from the RFC's table. */
TEST(utf8_strict_validator) {
    CHECK(qf_utf8_valid("", 0));
    CHECK(qf_utf8_valid("plain ascii\n", 12));
    CHECK(qf_utf8_valid("a\0b", 3)); /* NUL is a valid code point */
    const char *good = "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80 \xf4\x8f\xbf\xbf"; /* e-acute, euro, rocket, U+10FFFF */
    CHECK(qf_utf8_valid(good, strlen(good)));
    static const char *bad[] = {
        "\x80",             /* lone continuation */
        "\xc0\xaf",         /* overlong '/' */
        "\xc1\xbf",         /* overlong */
        "\xe0\x80\xaf",     /* overlong 3-byte */
        "\xf0\x80\x80\xaf", /* overlong 4-byte */
        "\xed\xa0\x80",     /* surrogate U+D800 */
        "\xed\xbf\xbf",     /* surrogate U+DFFF */
        "\xf4\x90\x80\x80", /* U+110000 */
        "\xf5\x80\x80\x80", /* lead byte past F4 */
        "\xff",
        "\xe2\x82",         /* truncated */
        "\xc3\x28",         /* bad continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_MSG(!qf_utf8_valid(bad[i], strlen(bad[i])), "bad[%zu] accepted", i);
        CHECK_EQ_INT(qf_utf8_valid_len((const uint8_t *)bad[i], strlen(bad[i])), 0);
    }
    CHECK_EQ_INT(qf_utf8_valid_len((const uint8_t *)"\xe2\x82\xac!", 4), 3);
    CHECK_EQ_INT(qf_utf8_valid_len((const uint8_t *)"x", 0), 0);
    /* every 1-, 2- and 3-byte sequence against the RFC's rules */
    int wrong = 0;
    for (uint32_t a = 0; a < 256; a++)
        for (uint32_t b = 0; b < 256; b++) {
            uint8_t s2[2] = {(uint8_t)a, (uint8_t)b};
            bool want = a < 0x80 ? (b < 0x80) : (a >= 0xc2 && a <= 0xdf && (b & 0xc0) == 0x80);
            if (qf_utf8_valid(s2, 2) != want) wrong++;
        }
    for (uint32_t cp = 0x800; cp < 0x10000; cp++) {
        uint8_t s3[3] = {(uint8_t)(0xe0 | cp >> 12), (uint8_t)(0x80 | ((cp >> 6) & 0x3f)), (uint8_t)(0x80 | (cp & 0x3f))};
        if (qf_utf8_valid(s3, 3) != !(cp >= 0xd800 && cp <= 0xdfff)) wrong++;
    }
    CHECK_EQ_INT(wrong, 0);
}

/* QF_ASSERT stays on in every build: a broken invariant prints file:line and the condition on
 * stderr and aborts (checked in a child process); a true one costs nothing visible. */
static int assert_twice(int x) {
    QF_ASSERT(x == 2);
    return x * 2;
}
TEST(qf_assert_aborts_with_file_line) {
    CHECK_EQ_INT(assert_twice(2), 4);
    int fd[2];
    CHECK(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid < 0) return;
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        assert_twice(3);
        _exit(0); /* not reached */
    }
    close(fd[1]);
    char buf[512] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
    close(fd[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "child status 0x%x", status);
    CHECK_MSG(strstr(buf, "test_util.c:") && strstr(buf, "assertion failed: x == 2"), "stderr: %s", buf);
}

/* Cases run only by tests/cli_harness.sh (QF_TEST_HARNESS_SELFTEST=1): the harness must FAIL
 * a case that checks nothing and report a missing data file as SKIP with its name. */
TEST(selftest_checks_nothing) {}
TEST(selftest_missing_data) {
    const char *p;
    TEST_DATA_OR_SKIP(p, "no/such/file.gguf");
    CHECK(p != NULL);
}

int main(void) {
    if (getenv("QF_TEST_HARNESS_SELFTEST")) {
        RUN(selftest_checks_nothing);
        RUN(selftest_missing_data);
        return test_summary();
    }
    RUN(utf8_strict_validator);
    RUN(qf_assert_aborts_with_file_line);
    RUN(f16_roundtrip_all_finite);
    RUN(sha256_known_vector);
    RUN(atomic_write_and_abort);
    RUN(atomic_write_disk_full);
    RUN(read_missing_file);
    RUN(pool_runs_every_index);
    RUN(error_names_and_codes);
    return test_summary();
}
