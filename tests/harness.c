/* harness.c: the runner side of test.h (case bookkeeping, data paths, temp dirs). */
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "qforge/artifact.h"
#include "qforge/artifact_bind.h"

int qf_test_failed_checks;
int qf_test_checks;
const char *qf_test_skip_reason;
const char *qf_test_current;
static int n_pass, n_fail, n_skip;

/* QF_TEST_ONLY=a,b,c runs only the cases named (device runs with a time budget); the others
 * are neither run nor counted */
static bool selected(const char *name) {
    const char *only = getenv("QF_TEST_ONLY");
    if (!only || !*only) return true;
    const size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

void qf_test_run(const char *name, void (*fn)(void)) {
    if (!selected(name)) return;
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

/* <fam>.logits: "QFLG", u32 version 1, u32 n_tok, u32 n_vocab, i32 tokens[], f32 logits[][] */
bool test_read_logits(const char *path, test_logits *r) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4];
    uint32_t hdr[3];
    bool ok = fread(magic, 1, 4, f) == 4 && memcmp(magic, "QFLG", 4) == 0 && fread(hdr, 4, 3, f) == 3 &&
              hdr[0] == 1 && hdr[1] > 0 && hdr[1] <= 4096 && hdr[2] > 0 && hdr[2] <= (1u << 20);
    if (ok) {
        r->n_tok = (int)hdr[1];
        r->n_vocab = (int)hdr[2];
        r->tokens = malloc((size_t)r->n_tok * sizeof(int32_t));
        r->logits = malloc((size_t)r->n_tok * r->n_vocab * sizeof(float));
        ok = r->tokens && r->logits && fread(r->tokens, 4, (size_t)r->n_tok, f) == (size_t)r->n_tok &&
             fread(r->logits, 4, (size_t)r->n_tok * r->n_vocab, f) == (size_t)r->n_tok * r->n_vocab;
    }
    fclose(f);
    return ok;
}

void test_free_logits(test_logits *r) {
    free(r->tokens);
    free(r->logits);
}

qf_status test_bind_int8(qf_context *c, const char *klay, const char *vlay, qf_error *e) {
    const qf_hparams *hp = qf_model_hparams(qf_context_model(c));
    const int n = hp->n_layer * hp->n_head_kv;
    int64_t shape[2] = {hp->n_layer, hp->n_head_kv};
    float *sc = malloc(sizeof(float) * (size_t)n);
    if (!sc) {
        e->code = QF_ERR_NOMEM;
        snprintf(e->msg, sizeof e->msg, "out of memory");
        return QF_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) sc[i] = 0.05f;
    qf_payload pl = {0};
    qf_status st = qf_payload_add_f32(&pl, "k_scale", sc, 2, shape, e);
    if (!st) st = qf_payload_add_f32(&pl, "v_scale", sc, 2, shape, e);
    if (!st) st = qf_payload_add_string(&pl, "k_layout", klay, e);
    if (!st) st = qf_payload_add_string(&pl, "v_layout", vlay, e);
    if (!st) st = qf_context_bind_payload(c, QF_ARTIFACT_KV_INT8, &pl, e);
    qf_payload_free(&pl);
    free(sc);
    return st;
}
