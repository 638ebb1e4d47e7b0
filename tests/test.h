/* test.h: the tiny test harness every tests/test_*.c uses.
 *
 *   TEST(name) { CHECK(x); CHECK_NEAR(a, b, tol); if (!path) SKIP("why"); }
 *   int main(void) { RUN(name); ...; return test_summary(); }
 *
 * Each binary prints PASS/FAIL/SKIP per case and a closing "N passed, N failed, N skipped"
 * line; tests/run.sh adds these up into the suite's closing line. A case fails when any check
 * fails, and also when it ran no check at all without calling SKIP. A case whose data file is
 * missing must SKIP with the reason (see TEST_DATA_OR_SKIP), never return silently. */
#ifndef QF_TEST_H
#define QF_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/model.h"

extern int qf_test_failed_checks; /* checks failed in the current case */
extern int qf_test_checks;        /* checks run in the current case (a case that runs none and
                                   * does not SKIP fails: it tested nothing) */
extern const char *qf_test_skip_reason;
extern const char *qf_test_current;

void qf_test_run(const char *name, void (*fn)(void));
/* A reference-logits fixture (tests/fixtures/families/<fam>.logits, written by
 * tools/hf_families.py): "QFLG", u32 version 1, u32 n_tok, u32 n_vocab, i32 tokens[n_tok],
 * f32 logits[n_tok][n_vocab]. test_read_logits fills r and returns true, or returns false (r
 * zeroed or partly filled: test_free_logits it either way) on a missing or malformed file. */
typedef struct {
    int n_tok, n_vocab;
    int32_t *tokens;
    float *logits;
} test_logits;
bool test_read_logits(const char *path, test_logits *r);
void test_free_logits(test_logits *r);
int test_summary(void);
/* Path of a file under the shared data directory ($QF_DATA_DIR, default ../shared/data
 * relative to the repository root), or NULL when it is absent. Returns a static buffer. */
const char *test_data(const char *rel);
/* A fresh empty temporary directory for the current test (removed by the OS, not us). */
const char *test_tmpdir(void);
/* Path of the built CLI binary (for end-to-end tests). */
const char *test_cli(void);
/* Bind a synthetic kv-int8 payload to c: K and V row layouts klay / vlay (the payload's names:
 * "static", "static-rot", "token", "token-rot", "ec-rot") and per-(layer, kv head) scales of
 * 0.05, the static layouts' step (the token and ec layouts carry their own). QF_OK, or the
 * failing call's status, said in *e. */
qf_status test_bind_int8(qf_context *c, const char *klay, const char *vlay, qf_error *e);

#define TEST(name) static void name(void)
#define RUN(name) qf_test_run(#name, name)

#define CHECK(cond)                                                                  \
    do {                                                                             \
    qf_test_checks++;                                                            \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            qf_test_failed_checks++;                                                 \
        }                                                                            \
    } while (0)

#define CHECK_MSG(cond, ...)                                                         \
    do {                                                                             \
    qf_test_checks++;                                                            \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
            qf_test_failed_checks++;                                                 \
        }                                                                            \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                           \
    do {                                                                             \
    qf_test_checks++;                                                            \
        long long qa_ = (long long)(a), qb_ = (long long)(b);                        \
        if (qa_ != qb_) {                                                            \
            fprintf(stderr, "  %s:%d: %s == %s failed: %lld vs %lld\n", __FILE__, __LINE__, \
                    #a, #b, qa_, qb_);                                               \
            qf_test_failed_checks++;                                                 \
        }                                                                            \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                        \
    do {                                                                             \
    qf_test_checks++;                                                            \
        double qa_ = (double)(a), qb_ = (double)(b), qt_ = (double)(tol);            \
        if (!(fabs(qa_ - qb_) <= qt_)) {                                             \
            fprintf(stderr, "  %s:%d: |%s - %s| <= %g failed: %.9g vs %.9g\n", __FILE__, \
                    __LINE__, #a, #b, qt_, qa_, qb_);                                \
            qf_test_failed_checks++;                                                 \
        }                                                                            \
    } while (0)

/* Set `var` to the path of the data file `rel` (see test_data), or SKIP the case naming it. */
#define TEST_DATA_OR_SKIP(var, rel)                                                  \
    do {                                                                             \
        (var) = test_data(rel);                                                      \
        if (!(var)) SKIP("data file " rel " not found under $QF_DATA_DIR");           \
    } while (0)

#define SKIP(reason)                                                                 \
    do {                                                                             \
        qf_test_skip_reason = (reason);                                              \
        return;                                                                      \
    } while (0)

#endif
