/* test_util.c: the util layer: f16/bf16 conversion, atomic writes, SHA-256, the pool. */
#include <signal.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* qf_f16_to_f32 (inline, branch-free) against the format's definition for every half: (-1)^s
 * m 2^-24 for exponent 0 (signed zeros included), (1024 + m) 2^(e - 25) for normals, infinities,
 * and NaNs keeping their payload bits */
TEST(f16_to_f32_every_half) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, sign = (h & 0x8000u) << 16;
        const float f = qf_f16_to_f32((uint16_t)h);
        uint32_t got, want;
        memcpy(&got, &f, 4);
        if (e == 31) {
            want = sign | 0x7f800000u | (m << 13);
        } else {
            float r = e ? ldexpf((float)(1024 + m), (int)e - 25) : ldexpf((float)m, -24);
            memcpy(&want, &r, 4);
            want |= sign;
        }
        bad += got != want;
    }
    CHECK_EQ_INT(bad, 0);
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


static bool exists(const char *p) { return access(p, F_OK) == 0; }

/* A pid that is certainly dead: a child that exited and was reaped. */
static long dead_pid(void) {
    pid_t c = fork();
    if (c == 0) _exit(0);
    int st;
    waitpid(c, &st, 0);
    return (long)c;
}

/* SIGTERM/SIGINT while an atomic write or a temp file is open: the temp files go, the target
 * is untouched, and the process still dies of the signal. */
TEST(temp_files_removed_on_signal) {
    const char *dir = test_tmpdir();
    char target[4096], tmp[4200], tpath[4096], env[4200];
    snprintf(target, sizeof target, "%s/sig-target.bin", dir);
    snprintf(env, sizeof env, "%s", dir);
    int sigs[2] = {SIGTERM, SIGINT};
    for (int k = 0; k < 2; k++) {
        /* a signal the process ignores (a background job's SIGINT, nohup's SIGHUP) stays
         * ignored: nothing to clean up because nothing dies of it */
        struct sigaction cur;
        if (sigaction(sigs[k], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN) continue;
        unlink(target);
        int fds[2];
        CHECK(pipe(fds) == 0);
        pid_t c = fork();
        if (c == 0) {
            close(fds[0]);
            setenv("TMPDIR", env, 1);
            qf_atomic_file af;
            qf_error e;
            char tp[4096];
            if (qf_atomic_open(&af, target, &e) || qf_atomic_write(&af, "partial", 7, &e)) _exit(3);
            if (qf_temp_create("qforge-test", tp, sizeof tp, &e)) _exit(4);
            fflush(af.fp);
            dprintf(fds[1], "%s\n%s\n", af.tmp_path, tp);
            close(fds[1]);
            kill(getpid(), sigs[k]);
            _exit(5); /* not reached */
        }
        close(fds[1]);
        char buf[9000] = {0};
        ssize_t n = 0, r;
        while ((r = read(fds[0], buf + n, sizeof buf - 1 - (size_t)n)) > 0) n += r;
        close(fds[0]);
        int st;
        waitpid(c, &st, 0);
        CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == sigs[k], "child status %d", st);
        CHECK(sscanf(buf, "%4199s %4095s", tmp, tpath) == 2);
        CHECK_MSG(!exists(tmp), "%s left behind", tmp);
        CHECK_MSG(!exists(tpath), "%s left behind", tpath);
        CHECK(!exists(target));
    }
}

/* kill -9 cannot be caught: the next writer of the same target sweeps "<target>.tmp.<pid>" of
 * dead processes (never a live one's), and qf_temp_create sweeps "<prefix>-<pid>-*". */
TEST(stale_temp_files_swept) {
    const char *dir = test_tmpdir();
    char target[4096], stale[4200], live[4200], other[4200], stale2[4200];
    snprintf(target, sizeof target, "%s/sweep-target.bin", dir);
    long dead = dead_pid();
    snprintf(stale, sizeof stale, "%s.tmp.%ld", target, dead);
    snprintf(live, sizeof live, "%s.tmp.%ld", target, (long)getppid()); /* alive */
    snprintf(other, sizeof other, "%s/unrelated.bin.tmp.%ld", dir, dead);
    qf_error e;
    CHECK(qf_write_file_atomic(stale, "x", 1, &e) == QF_OK);
    CHECK(qf_write_file_atomic(live, "x", 1, &e) == QF_OK);
    CHECK(qf_write_file_atomic(other, "x", 1, &e) == QF_OK);
    CHECK(qf_write_file_atomic(target, "new", 3, &e) == QF_OK);
    CHECK(!exists(stale));
    CHECK(exists(live));  /* its owner may still be writing */
    CHECK(exists(other)); /* another target's temp file is not ours to judge */
    unlink(live), unlink(other), unlink(target);

    char old_tmpdir[4096] = "";
    const char *t = getenv("TMPDIR");
    if (t) snprintf(old_tmpdir, sizeof old_tmpdir, "%s", t);
    setenv("TMPDIR", dir, 1);
    snprintf(stale2, sizeof stale2, "%s/qforge-test-%ld-abcdef", dir, dead);
    CHECK(qf_write_file_atomic(stale2, "x", 1, &e) == QF_OK);
    char p[4096];
    CHECK(qf_temp_create("qforge-test", p, sizeof p, &e) == QF_OK);
    CHECK(!exists(stale2));
    CHECK(exists(p));
    qf_temp_remove(p);
    CHECK(!exists(p));
    if (old_tmpdir[0]) setenv("TMPDIR", old_tmpdir, 1);
    else unsetenv("TMPDIR");
}

/* Outputs that are inputs: same path, another spelling, a symlink, a hard link; outputs that
 * are each other; unwritable or missing directories; a directory as an output. */
TEST(output_path_checks) {
    const char *dir = test_tmpdir();
    char a[4096], a2[4096], ln[4096], hl[4096], b[4096], sub[4096];
    snprintf(a, sizeof a, "%s/in.gguf", dir);
    snprintf(a2, sizeof a2, "%s/./in.gguf", dir);
    snprintf(ln, sizeof ln, "%s/link.gguf", dir);
    snprintf(hl, sizeof hl, "%s/hard.gguf", dir);
    snprintf(b, sizeof b, "%s/new.gguf", dir);
    snprintf(sub, sizeof sub, "%s/nodir/x.gguf", dir);
    qf_error e;
    CHECK(qf_write_file_atomic(a, "GGUF", 4, &e) == QF_OK);
    unlink(ln), unlink(hl);
    CHECK(symlink(a, ln) == 0);
    CHECK(link(a, hl) == 0);
    CHECK(qf_same_file(a, a));
    CHECK(qf_same_file(a, a2));
    CHECK(qf_same_file(a, ln));
    CHECK(qf_same_file(a, hl));
    CHECK(!qf_same_file(a, b));
    CHECK(qf_same_file(b, b)); /* does not exist yet: same canonical path */
    CHECK(!qf_same_file("-", "-"));
    const char *ins[] = {a}, *in_names[] = {"-m"};
    const char *outs[] = {ln}, *out_names[] = {"-o"};
    CHECK(qf_check_outputs(ins, in_names, 1, outs, out_names, 1, &e) == QF_ERR_ARG);
    CHECK(strstr(e.msg, "-o") && strstr(e.msg, "-m"));
    const char *outs2[] = {b, b}, *out_names2[] = {"-o", "--eval-out"};
    CHECK(qf_check_outputs(ins, in_names, 1, outs2, out_names2, 2, &e) == QF_ERR_ARG);
    CHECK(qf_check_outputs(ins, in_names, 1, outs2, out_names2, 1, &e) == QF_OK);
    CHECK(qf_check_writable(b, QF_ERR_IO, &e) == QF_OK);
    CHECK(qf_check_writable(sub, QF_ERR_PACKAGE_FAILED, &e) == QF_ERR_PACKAGE_FAILED);
    CHECK(qf_check_writable(dir, QF_ERR_IO, &e) == QF_ERR_IO && strstr(e.msg, "directory"));
    char *got;
    size_t len;
    CHECK(qf_read_file(dir, &got, &len, &e) == QF_ERR_IO && strstr(e.msg, "is a directory"));
    unlink(ln), unlink(hl), unlink(a);
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

/* the reference: a stable top-down merge sort with the comparison qf_kv_rq_lloyd used */
static int ref_cmp(float x, float y) { return (x > y) - (x < y); }
static void ref_msort(float *v, float *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2, i = 0, j = h, k = 0;
    ref_msort(v, tmp, h), ref_msort(v + h, tmp, n - h);
    while (i < h && j < n) tmp[k++] = ref_cmp(v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof(float));
}

/* qf_sort_floats: the stable comparison sort's exact bytes (both zeros keep their input order,
 * repeated values, negatives, denormals, large magnitudes), and lengths 0 to 300000 */
TEST(sort_floats_is_the_stable_sort) {
    const size_t ns[] = {0, 1, 2, 3, 1000, 65537, 300000};
    uint64_t st = 11;
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        const size_t n = ns[c];
        const size_t bytes = sizeof(float) * (n + 1);
        float *a = malloc(bytes), *b = malloc(bytes), *t = malloc(bytes);
        CHECK(a && b && t);
        for (size_t i = 0; i < n; i++) {
            const uint64_t r = qf_splitmix64(&st);
            float f;
            switch (r % 7) {
            case 0: f = (r >> 8) % 2 ? 0.0f : -0.0f; break;
            case 1: f = (float)((int)((r >> 8) % 9) - 4); break;          /* repeated values */
            case 2: f = (float)((r >> 8) % 1000) * 1e-42f; break;         /* denormals */
            case 3: f = -(float)((r >> 8) % 100000) * 3.7e30f; break;     /* large, negative */
            default: f = (float)(qf_rand_unit(&st) * 20.0 - 10.0); break;
            }
            a[i] = b[i] = f;
        }
        CHECK(qf_sort_floats(a, n));
        ref_msort(b, t, n);
        CHECK_MSG(n == 0 || memcmp(a, b, n * sizeof(float)) == 0, "n = %zu", n);
        for (size_t i = 1; i < n; i++) CHECK(!(a[i] < a[i - 1]));
        free(a), free(b), free(t);
    }
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
    RUN(f16_to_f32_every_half);
    RUN(sha256_known_vector);
    RUN(atomic_write_and_abort);
    RUN(atomic_write_disk_full);
    RUN(read_missing_file);
    RUN(pool_runs_every_index);
    RUN(sort_floats_is_the_stable_sort);
    RUN(error_names_and_codes);
    RUN(temp_files_removed_on_signal);
    RUN(stale_temp_files_swept);
    RUN(output_path_checks);
    return test_summary();
}
