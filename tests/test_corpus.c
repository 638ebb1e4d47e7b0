/* test_corpus.c: the corpus stage: sources, normalization, document rules, the split, hashes,
 * CorpusEmpty, the CLI, and the Ollama client against tests/fake_ollama.py on loopback. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qforge/corpus.h"
#include "test.h"
#include "util/util.h"

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "  cannot write %s\n", path);
        return;
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

static void write_str(const char *dir, const char *name, const char *s) {
    write_file(dir, name, s, strlen(s));
}

/* The one document of a single-document corpus (it lands in the calibration part). */
static bool only_doc(qf_corpus *c, const char **text, size_t *len) {
    qf_error err = {0};
    if (qf_corpus_finalize(c, 0.2, &err) != QF_OK) {
        fprintf(stderr, "  finalize: %s\n", err.msg);
        return false;
    }
    if (qf_corpus_get_info(c)->n_docs != 1) return false;
    *text = qf_corpus_part_doc(c, QF_CORPUS_CALIB, 0, len);
    return *text != NULL;
}

TEST(normalizes_crlf_nul_bom_and_invalid_utf8) {
    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    static const char in[] = "\xEF\xBB\xBF  a\r\nb\rc\0d\xFF e \xC0\xAF \xED\xA0\x80 \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\n\n";
    CHECK(qf_corpus_add_text(c, "mixed", in, sizeof in - 1, &err) == QF_OK);
    const char *t;
    size_t n;
    CHECK(only_doc(c, &t, &n));
    static const char want[] = "a\nb\ncd\xEF\xBF\xBD e \xEF\xBF\xBD\xEF\xBF\xBD "
                               "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";
    CHECK_EQ_INT(n, sizeof want - 1);
    CHECK(t && n == sizeof want - 1 && memcmp(t, want, n) == 0);
    qf_corpus_free(c);
}

TEST(files_are_documents) {
    const char *dir = test_tmpdir();
    write_str(dir, "a.txt", "First file.\nIt has two lines.\n");
    write_str(dir, "b.txt", "Second file.\r\n");
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/a.txt", dir);
    snprintf(pb, sizeof pb, "%s/b.txt", dir);
    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    CHECK(qf_corpus_add_path(c, pa, &err) == QF_OK);
    CHECK(qf_corpus_add_path(c, pb, &err) == QF_OK);
    CHECK(qf_corpus_finalize(c, 0.5, &err) == QF_OK);
    const qf_corpus_info *in = qf_corpus_get_info(c);
    CHECK(in != NULL);
    if (!in) return;
    CHECK_EQ_INT(in->n_docs, 2);
    CHECK_EQ_INT(in->n_files, 2);
    CHECK_EQ_INT(in->n_calib_docs, 1);
    CHECK_EQ_INT(in->n_eval_docs, 1);
    CHECK_EQ_INT(in->n_bytes, strlen("First file.\nIt has two lines.") + strlen("Second file."));
    CHECK(strstr(qf_corpus_inputs(c), "a.txt") && strstr(qf_corpus_inputs(c), "b.txt"));
    qf_corpus_free(c);

    /* a missing path is an IO error naming it */
    c = qf_corpus_new();
    CHECK(qf_corpus_add_path(c, "/nonexistent/qforge-corpus", &err) == QF_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/qforge-corpus") != NULL);
    qf_corpus_free(c);
}

TEST(directory_recursive_sorted_binary_skipped) {
    const char *dir = test_tmpdir();
    char sub[4200], deep[4300];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    snprintf(deep, sizeof deep, "%s/deeper", sub);
    CHECK(mkdir(sub, 0755) == 0 && mkdir(deep, 0755) == 0);
    write_str(dir, "b.txt", "Top level b.\n");
    write_str(dir, "a.txt", "Top level a.\n");
    write_str(sub, "c.txt", "Nested c.\n");
    write_str(deep, "d.md", "Deeper d.\n");
    write_str(dir, ".hidden.txt", "hidden, never read\n");
    static const uint8_t bin[] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 1, 2, 3};
    write_file(dir, "model.bin", bin, sizeof bin);
    uint8_t junk[256];
    for (int i = 0; i < 256; i++) junk[i] = (uint8_t)(0x80 | (i * 37 % 128)); /* no NUL, not UTF-8 */
    write_file(sub, "junk.dat", junk, sizeof junk);

    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    CHECK(qf_corpus_add_path(c, dir, &err) == QF_OK);
    CHECK(qf_corpus_finalize(c, 0.25, &err) == QF_OK);
    const qf_corpus_info *in = qf_corpus_get_info(c);
    if (!in) return;
    CHECK_EQ_INT(in->n_files, 4);
    CHECK_EQ_INT(in->n_skipped_binary, 2);
    CHECK_EQ_INT(in->n_docs, 4);

    /* the same files added one by one in byte-wise sorted path order hash the same */
    qf_corpus *c2 = qf_corpus_new();
    const char *order[] = {"a.txt", "b.txt", "sub/c.txt", "sub/deeper/d.md"};
    for (int i = 0; i < 4; i++) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, order[i]);
        CHECK(qf_corpus_add_path(c2, p, &err) == QF_OK);
    }
    CHECK(qf_corpus_finalize(c2, 0.25, &err) == QF_OK);
    const qf_corpus_info *in2 = qf_corpus_get_info(c2);
    CHECK(in2 && strcmp(in->sha256_hex, in2->sha256_hex) == 0);
    CHECK(in2 && strcmp(in->eval_sha256_hex, in2->eval_sha256_hex) == 0);
    qf_corpus_free(c2);
    qf_corpus_free(c);

    /* a binary file named directly is refused, not skipped */
    char pbin[4300];
    snprintf(pbin, sizeof pbin, "%s/model.bin", dir);
    c = qf_corpus_new();
    CHECK(qf_corpus_add_path(c, pbin, &err) == QF_ERR_FORMAT);
    CHECK(strstr(err.msg, "model.bin") != NULL);
    qf_corpus_free(c);
}

TEST(endoftext_separates_documents) {
    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    const char *s = "one<|endoftext|>two\n<|endoftext|>  \n<|endoftext|>three<|endoftext|>";
    CHECK(qf_corpus_add_text(c, "eot", s, strlen(s), &err) == QF_OK);
    CHECK(qf_corpus_finalize(c, 0.34, &err) == QF_OK);
    const qf_corpus_info *in = qf_corpus_get_info(c);
    CHECK(in && in->n_docs == 3 && in->n_bytes == 11 && in->n_eval_docs == 1);
    qf_corpus_free(c);
}

TEST(long_text_splits_at_paragraphs) {
    /* 100 paragraphs of ~300 bytes, separated by one blank line */
    size_t cap = 100 * 400, n = 0;
    char *text = malloc(cap);
    for (int p = 0; p < 100; p++) {
        n += (size_t)snprintf(text + n, cap - n, "Paragraph %d.", p);
        for (int w = 0; w < 40; w++) n += (size_t)snprintf(text + n, cap - n, "%s", w % 9 == 8 ? " word\n" : " word");
        n += (size_t)snprintf(text + n, cap - n, "\n\n");
    }
    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    CHECK(qf_corpus_set_doc_kb(c, 4, &err) == QF_OK);
    CHECK(qf_corpus_add_text(c, "long", text, n, &err) == QF_OK);
    CHECK(qf_corpus_finalize(c, 0.2, &err) == QF_OK);
    const qf_corpus_info *in = qf_corpus_get_info(c);
    if (!in) return;
    size_t trimmed = n - 2; /* the trailing blank line goes */
    CHECK(in->n_docs >= 5 && in->n_docs <= 8);
    CHECK_EQ_INT(in->n_bytes + 2 * (in->n_docs - 1), trimmed); /* nothing lost, cut at "\n\n" */
    for (int part = 0; part < 2; part++) {
        for (size_t i = 0; i < qf_corpus_part_docs(c, (qf_corpus_part)part); i++) {
            size_t len;
            const char *d = qf_corpus_part_doc(c, (qf_corpus_part)part, i, &len);
            CHECK(strncmp(d, "Paragraph ", 10) == 0);
            CHECK_MSG(len >= 4096 - 600 && len <= 4096 + 2048 + 600, "doc of %zu bytes", len);
        }
    }
    qf_corpus_free(c);

    /* doc_kb 0: never split */
    c = qf_corpus_new();
    CHECK(qf_corpus_set_doc_kb(c, 0, &err) == QF_OK);
    CHECK(qf_corpus_add_text(c, "long", text, n, &err) == QF_OK);
    const char *t;
    size_t len;
    CHECK(only_doc(c, &t, &len) && len == trimmed);
    qf_corpus_free(c);
    free(text);
}

static qf_corpus *numbered(int n, bool reverse, double frac) {
    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    for (int k = 0; k < n; k++) {
        int i = reverse ? n - 1 - k : k;
        char buf[128];
        snprintf(buf, sizeof buf, "Document number %d talks about topic %d.", i, i * 7 % 11);
        qf_corpus_add_text(c, "gen", buf, strlen(buf), &err);
    }
    if (qf_corpus_finalize(c, frac, &err) != QF_OK) fprintf(stderr, "  finalize: %s\n", err.msg);
    return c;
}

static bool in_part(const qf_corpus *c, qf_corpus_part p, const char *doc, size_t len) {
    for (size_t i = 0; i < qf_corpus_part_docs(c, p); i++) {
        size_t l;
        const char *d = qf_corpus_part_doc(c, p, i, &l);
        if (l == len && memcmp(d, doc, len) == 0) return true;
    }
    return false;
}

TEST(split_deterministic_and_disjoint) {
    qf_corpus *a = numbered(50, false, 0.2), *b = numbered(50, false, 0.2);
    const qf_corpus_info *ia = qf_corpus_get_info(a), *ib = qf_corpus_get_info(b);
    CHECK(ia && ib);
    if (!ia || !ib) return;
    CHECK_EQ_INT(ia->n_eval_docs, 10);
    CHECK_EQ_INT(ia->n_calib_docs, 40);
    CHECK(strcmp(ia->sha256_hex, ib->sha256_hex) == 0);
    CHECK(strcmp(ia->calib_sha256_hex, ib->calib_sha256_hex) == 0);
    CHECK(strcmp(ia->eval_sha256_hex, ib->eval_sha256_hex) == 0);
    size_t la, lb;
    const char *ta = qf_corpus_eval_text(a, &la), *tb = qf_corpus_eval_text(b, &lb);
    CHECK(la == lb && memcmp(ta, tb, la) == 0);
    for (size_t i = 0; i < qf_corpus_part_docs(a, QF_CORPUS_EVAL); i++) {
        size_t l;
        const char *d = qf_corpus_part_doc(a, QF_CORPUS_EVAL, i, &l);
        CHECK(!in_part(a, QF_CORPUS_CALIB, d, l));
        CHECK(!strstr(qf_corpus_calib_text(a, NULL), d));
    }
    /* joined text = documents + "\n\n" separators */
    size_t lc;
    qf_corpus_calib_text(a, &lc);
    CHECK_EQ_INT(lc, ia->calib_bytes + 2 * (ia->n_calib_docs - 1));

    /* the held-out set depends on the documents, not their order */
    qf_corpus *r = numbered(50, true, 0.2);
    CHECK(strcmp(qf_corpus_get_info(r)->sha256_hex, ia->sha256_hex) != 0);
    for (size_t i = 0; i < qf_corpus_part_docs(r, QF_CORPUS_EVAL); i++) {
        size_t l;
        const char *d = qf_corpus_part_doc(r, QF_CORPUS_EVAL, i, &l);
        CHECK(in_part(a, QF_CORPUS_EVAL, d, l));
    }
    qf_corpus_free(r);
    qf_corpus_free(a);
    qf_corpus_free(b);

    /* both parts non-empty from 2 documents, whatever the fraction; 1 document: all calib */
    double fracs[] = {0.001, 0.5, 0.999};
    for (int k = 0; k < 3; k++) {
        qf_corpus *c = numbered(2, false, fracs[k]);
        const qf_corpus_info *in = qf_corpus_get_info(c);
        CHECK(in && in->n_calib_docs == 1 && in->n_eval_docs == 1);
        qf_corpus_free(c);
    }
    qf_corpus *one = numbered(1, false, 0.5);
    CHECK(qf_corpus_get_info(one) && qf_corpus_get_info(one)->n_eval_docs == 0);
    size_t le = 99;
    CHECK(qf_corpus_eval_text(one, &le) && le == 0);
    qf_corpus_free(one);

    /* a bad fraction is an argument error */
    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    qf_corpus_add_text(c, "x", "x", 1, &err);
    CHECK(qf_corpus_finalize(c, 1.0, &err) == QF_ERR_ARG);
    CHECK(qf_corpus_finalize(c, 0.0, &err) == QF_ERR_ARG);
    qf_corpus_free(c);
}

TEST(hash_is_stable_and_framed) {
    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    CHECK(qf_corpus_add_text(c, "t", "hello world\r\n", 13, &err) == QF_OK);
    CHECK(qf_corpus_add_text(c, "t", "second doc", 10, &err) == QF_OK);
    CHECK(qf_corpus_add_text(c, "dup", "  hello world\n", 14, &err) == QF_OK); /* duplicate */
    CHECK(qf_corpus_finalize(c, 0.5, &err) == QF_OK);
    const qf_corpus_info *in = qf_corpus_get_info(c);
    if (!in) return;
    CHECK_EQ_INT(in->n_docs, 2);
    CHECK_EQ_INT(in->n_duplicate_docs, 1);
    /* SHA-256 over (u64 little-endian length, bytes) per document, input order */
    uint8_t buf[64], want[32];
    size_t n = 0;
    const char *docs[2] = {"hello world", "second doc"};
    for (int i = 0; i < 2; i++) {
        uint64_t l = strlen(docs[i]);
        for (int k = 0; k < 8; k++) buf[n++] = (uint8_t)(l >> (8 * k));
        memcpy(buf + n, docs[i], l);
        n += l;
    }
    qf_sha256(buf, n, want);
    CHECK(memcmp(in->sha256, want, 32) == 0);
    /* pinned: a change here changes every recorded provenance; update docs/corpus.md with it */
    CHECK_MSG(strcmp(in->sha256_hex, "7df46f302a65ca17ddf0cc84e04455ee5a1260cce4a8d2791e1cc6c914fbd9f8") == 0,
              "got %s", in->sha256_hex);
    qf_corpus_free(c);
}

TEST(corpus_empty) {
    qf_error err = {0};
    qf_corpus *c = qf_corpus_new();
    CHECK(qf_corpus_finalize(c, 0.2, &err) == QF_ERR_CORPUS_EMPTY);
    qf_corpus_free(c);

    c = qf_corpus_new();
    CHECK(qf_corpus_add_text(c, "blank-input", " \n\t\r\n\0 <|endoftext|>\n", 22, &err) == QF_OK);
    CHECK(qf_corpus_finalize(c, 0.2, &err) == QF_ERR_CORPUS_EMPTY);
    CHECK(strstr(err.msg, "blank-input") != NULL);
    CHECK(strcmp(qf_status_name(err.code), "CorpusEmpty") == 0);
    qf_corpus_free(c);

    const char *dir = test_tmpdir();
    write_str(dir, "empty.txt", "");
    write_file(dir, "bin.dat", "\0\0\0", 3);
    c = qf_corpus_new();
    CHECK(qf_corpus_add_path(c, dir, &err) == QF_OK);
    CHECK(qf_corpus_finalize(c, 0.2, &err) == QF_ERR_CORPUS_EMPTY);
    CHECK(strstr(err.msg, dir) != NULL);
    /* finalize refused, but the corpus is still open: nothing is half-built */
    CHECK(qf_corpus_get_info(c) == NULL);
    qf_corpus_free(c);
}

TEST(reads_stdin) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    const char *s = "from stdin\r\nline two\n<|endoftext|>second stdin doc\n";
    CHECK(write(fds[1], s, strlen(s)) == (ssize_t)strlen(s));
    close(fds[1]);
    fflush(stdin);
    int saved = dup(0);
    dup2(fds[0], 0);
    close(fds[0]);
    clearerr(stdin);
    qf_corpus *c = qf_corpus_new();
    qf_error err = {0};
    CHECK(qf_corpus_add_path(c, "-", &err) == QF_OK);
    dup2(saved, 0);
    close(saved);
    clearerr(stdin);
    CHECK(qf_corpus_finalize(c, 0.5, &err) == QF_OK);
    const qf_corpus_info *in = qf_corpus_get_info(c);
    CHECK(in && in->n_docs == 2);
    CHECK(in && in->n_bytes == strlen("from stdin\nline two") + strlen("second stdin doc"));
    CHECK(strcmp(qf_corpus_inputs(c), "<stdin>") == 0);
    qf_corpus_free(c);
}

TEST(builtin_demo_corpus) {
    char path[4096];
    qf_error err = {0};
    if (qf_corpus_builtin_path(path, sizeof path, &err) != QF_OK) SKIP("demo corpus not found");
    CHECK(strstr(path, "kerneldoc-demo/docs.txt") != NULL);
    qf_corpus *c = qf_corpus_new();
    CHECK(qf_corpus_add_builtin(c, &err) == QF_OK);
    CHECK(qf_corpus_finalize(c, 0.2, &err) == QF_OK);
    const qf_corpus_info *in = qf_corpus_get_info(c);
    if (!in) return;
    CHECK(in->n_docs >= 40 && in->n_docs <= 80);
    CHECK(in->n_bytes > 500000);
    CHECK(in->n_eval_docs == (size_t)floor(in->n_docs * 0.2 + 0.5));
    CHECK(in->calib_bytes > 3 * in->eval_bytes);
    qf_corpus_free(c);

    /* $QF_ASSETS_DIR wins, and a wrong one is reported with the places tried */
    const char *old = getenv("QF_ASSETS_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("QF_ASSETS_DIR", "/nonexistent-assets", 1);
    CHECK(qf_corpus_builtin_path(path, sizeof path, &err) == QF_OK); /* falls back next to the exe */
    if (saved) setenv("QF_ASSETS_DIR", saved, 1);
    else unsetenv("QF_ASSETS_DIR");
    free(saved);
}

/* ---- the CLI ---- */

TEST(cli_writes_calib_and_eval) {
    const char *cli = test_cli();
    if (access(cli, X_OK) != 0) SKIP("qforge CLI not built");
    const char *dir = test_tmpdir();
    char in[4200], out[4200], cmd[9000];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    CHECK(mkdir(in, 0755) == 0);
    for (int i = 0; i < 10; i++) {
        char name[32], body[128];
        snprintf(name, sizeof name, "doc%02d.txt", i);
        snprintf(body, sizeof body, "CLI document %d.\r\nWith a second line %d.\n", i, i * i);
        write_str(in, name, body);
    }
    snprintf(cmd, sizeof cmd, "%s corpus '%s' --eval-frac 0.3 --json -o '%s' > '%s/report.json'", cli,
             in, out, dir);
    CHECK(system(cmd) == 0);
    char p[4400];
    char *calib = NULL, *eval = NULL, *report = NULL;
    size_t lc = 0, le = 0, lr = 0;
    qf_error err = {0};
    snprintf(p, sizeof p, "%s/calib.txt", out);
    CHECK(qf_read_file(p, &calib, &lc, &err) == QF_OK);
    snprintf(p, sizeof p, "%s/eval.txt", out);
    CHECK(qf_read_file(p, &eval, &le, &err) == QF_OK);
    snprintf(p, sizeof p, "%s/report.json", dir);
    CHECK(qf_read_file(p, &report, &lr, &err) == QF_OK);
    if (calib && eval && report) {
        CHECK(strstr(report, "\"docs\": 10") != NULL);
        CHECK(strstr(calib, "\r") == NULL && strstr(eval, "\r") == NULL);
        CHECK(strstr(eval, "CLI document") != NULL);
        /* the library gives the same split */
        qf_corpus *c = qf_corpus_new();
        qf_corpus_add_path(c, in, &err);
        CHECK(qf_corpus_finalize(c, 0.3, &err) == QF_OK);
        size_t n;
        const char *t = qf_corpus_eval_text(c, &n);
        CHECK(t && n == le && memcmp(t, eval, n) == 0);
        CHECK(strstr(report, qf_corpus_get_info(c)->sha256_hex) != NULL);
        qf_corpus_free(c);
    }
    free(calib);
    free(eval);
    free(report);

    /* empty input: CorpusEmpty's exit code, and nothing written */
    snprintf(cmd, sizeof cmd, "printf '  \\n' | %s corpus --stdin -o '%s/none' 2>/dev/null", cli, dir);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == qf_status_exit_code(QF_ERR_CORPUS_EMPTY));
    snprintf(p, sizeof p, "%s/none/calib.txt", dir);
    CHECK(access(p, F_OK) != 0);
}

/* ---- Ollama, against tests/fake_ollama.py on 127.0.0.1 ---- */

static pid_t fake_pid = -1;

/* Start the fake server; returns its port, or 0 (with a reason) when it cannot run here. */
static int start_fake(const char **why) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        *why = "python3 is not installed";
        return 0;
    }
    if (access("tests/fake_ollama.py", R_OK) != 0) {
        *why = "tests/fake_ollama.py not found (run from the repository root)";
        return 0;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        *why = "pipe failed";
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execlp("python3", "python3", "tests/fake_ollama.py", "--lifetime", "60", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        *why = "fork failed";
        return 0;
    }
    fake_pid = pid;
    char line[32] = "";
    size_t n = 0;
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    double t0 = qf_now_sec();
    while (n < sizeof line - 1 && !memchr(line, '\n', n) && qf_now_sec() - t0 < 15) {
        if (poll(&pfd, 1, 500) <= 0) continue;
        ssize_t got = read(fds[0], line + n, sizeof line - 1 - n);
        if (got <= 0) break;
        n += (size_t)got;
        line[n] = '\0';
    }
    close(fds[0]);
    int port = atoi(line);
    if (port <= 0 || port > 65535) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fake_pid = -1;
        *why = "fake_ollama.py did not start";
        return 0;
    }
    return port;
}

static void stop_fake(void) {
    if (fake_pid > 0) {
        kill(fake_pid, SIGTERM);
        waitpid(fake_pid, NULL, 0);
    }
    fake_pid = -1;
}

static qf_status synth(int port, const char *model, int n_docs, const char *prompts,
                       qf_corpus **out, qf_error *err) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    qf_ollama_opts o = {.url = url, .model = model, .n_docs = n_docs, .prompts_path = prompts,
                        .timeout_s = 20};
    qf_corpus *c = qf_corpus_new();
    qf_status st = qf_corpus_synthesize_ollama(c, &o, err);
    if (out) *out = c;
    else qf_corpus_free(c);
    return st;
}

TEST(ollama_synthesis) {
    const char *why = NULL;
    int port = start_fake(&why);
    if (!port) SKIP(why);
    const char *dir = test_tmpdir();
    write_str(dir, "prompts.txt", "alpha prompt\n\n  \nbeta prompt\r\n");
    char prompts[4200];
    snprintf(prompts, sizeof prompts, "%s/prompts.txt", dir);
    qf_corpus *c = NULL;
    qf_error err = {0};
    CHECK_MSG(synth(port, "tiny", 5, prompts, &c, &err) == QF_OK, "%s", err.msg);
    CHECK(qf_corpus_finalize(c, 0.2, &err) == QF_OK);
    const qf_corpus_info *in = qf_corpus_get_info(c);
    CHECK(in && in->n_docs == 5 && in->n_synth_docs == 5 && in->n_eval_docs == 1);
    for (int i = 0; i < 5; i++) { /* prompts cycle; seed i; CRLF normalized */
        char want[128];
        snprintf(want, sizeof want, "Synthetic document %d for prompt: %s\nSecond line.", i,
                 i % 2 ? "beta prompt" : "alpha prompt");
        CHECK_MSG(in_part(c, QF_CORPUS_CALIB, want, strlen(want)) ||
                      in_part(c, QF_CORPUS_EVAL, want, strlen(want)), "missing: %s", want);
    }
    CHECK(strstr(qf_corpus_inputs(c), "ollama:tiny@") != NULL);
    qf_corpus_free(c);

    /* the built-in prompt list */
    CHECK(synth(port, "tiny", 3, NULL, NULL, &err) == QF_OK);

    /* server-side failures are clear errors */
    CHECK(synth(port, "http500", 1, NULL, NULL, &err) == QF_ERR_OLLAMA_UNAVAILABLE);
    CHECK_MSG(strstr(err.msg, "HTTP 500") && strstr(err.msg, "boom"), "%s", err.msg);
    CHECK(synth(port, "missing", 1, NULL, NULL, &err) == QF_ERR_OLLAMA_UNAVAILABLE);
    CHECK_MSG(strstr(err.msg, "HTTP 404") && strstr(err.msg, "not found"), "%s", err.msg);
    CHECK(synth(port, "badjson", 1, NULL, NULL, &err) == QF_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "not a JSON") != NULL, "%s", err.msg);
    CHECK(synth(port, "noresponse", 1, NULL, NULL, &err) == QF_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "\"response\"") != NULL, "%s", err.msg);

    /* an empty prompt file is refused before any request */
    write_str(dir, "none.txt", "\n \n");
    snprintf(prompts, sizeof prompts, "%s/none.txt", dir);
    CHECK(synth(port, "tiny", 1, prompts, NULL, &err) == QF_ERR_FORMAT);
    stop_fake();
}

TEST(ollama_unavailable) {
    /* a port that was just free on loopback: nothing listens, the connect is refused */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
          getsockname(s, (struct sockaddr *)&a, &al) == 0);
    int port = ntohs(a.sin_port);
    close(s);
    qf_error err = {0};
    double t0 = qf_now_sec();
    CHECK(synth(port, "tiny", 2, NULL, NULL, &err) == QF_ERR_OLLAMA_UNAVAILABLE);
    CHECK(qf_now_sec() - t0 < 5);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    CHECK_MSG(strstr(err.msg, url) != NULL, "%s", err.msg);
    CHECK(strcmp(qf_status_name(err.code), "OllamaUnavailable") == 0);

    /* not a URL we speak */
    qf_ollama_opts o = {.url = "ftp://127.0.0.1:1", .model = "m", .n_docs = 1};
    char *reply = NULL;
    CHECK(qf_ollama_generate(&o, "p", 0, &reply, NULL, &err) == QF_ERR_ARG);
    CHECK(reply == NULL);
}

int main(void) {
    RUN(normalizes_crlf_nul_bom_and_invalid_utf8);
    RUN(files_are_documents);
    RUN(directory_recursive_sorted_binary_skipped);
    RUN(endoftext_separates_documents);
    RUN(long_text_splits_at_paragraphs);
    RUN(split_deterministic_and_disjoint);
    RUN(hash_is_stable_and_framed);
    RUN(corpus_empty);
    RUN(reads_stdin);
    RUN(builtin_demo_corpus);
    RUN(cli_writes_calib_and_eval);
    RUN(ollama_synthesis);
    RUN(ollama_unavailable);
    stop_fake();
    return test_summary();
}
