/* harness.c: the runner side of test.h (case bookkeeping, data paths, temp dirs). */
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

int qf_test_failed_checks;
int qf_test_checks;
const char *qf_test_skip_reason;
const char *qf_test_current;
static int n_pass, n_fail, n_skip;

void qf_test_run(const char *name, void (*fn)(void)) {
    qf_test_failed_checks = 0;
    qf_test_checks = 0;
    qf_test_skip_reason = NULL;
    qf_test_current = name;
    fn();
    if (qf_test_failed_checks) {
        printf("FAIL %s\n", name);
        n_fail++;
    } else if (qf_test_skip_reason) {
        printf("SKIP %s: %s\n", name, qf_test_skip_reason);
        n_skip++;
    } else if (qf_test_checks == 0) {
        printf("FAIL %s: ran no checks (a case must CHECK something or SKIP with a reason)\n", name);
        n_fail++;
    } else {
        printf("PASS %s\n", name);
        n_pass++;
    }
    fflush(stdout);
}

int test_summary(void) {
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}

const char *test_data(const char *rel) {
    static char buf[PATH_MAX];
    const char *dir = getenv("QF_DATA_DIR");
    snprintf(buf, sizeof buf, "%s/%s", dir ? dir : "../shared/data", rel);
    if (access(buf, R_OK) != 0) return NULL;
    return buf;
}

const char *test_tmpdir(void) {
    static char buf[PATH_MAX];
    const char *base = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/qftest.XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(buf)) return "/tmp";
    return buf;
}

const char *test_cli(void) {
    static char buf[PATH_MAX];
    const char *b = getenv("QF_BUILD");
    snprintf(buf, sizeof buf, "%s/qforge", b ? b : "build");
    return buf;
}
