/* fuzz_tokenizer.c: libFuzzer harness for the tokenizers. Loads one vocabulary once
 * ($QF_FUZZ_VOCAB, default ../shared/data/vocab/ggml-vocab-gpt-2.gguf; every input is a no-op
 * when it is absent), then tokenizes the input bytes with and without parse_special and
 * decodes every id, so ASan/UBSan see the whole path on arbitrary (invalid) UTF-8. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/gguf.h"
#include "qforge/tokenizer.h"

static qf_tokenizer *tok;
static int loaded; /* 0 not tried, 1 loaded, -1 unavailable */

static void load_once(void) {
    if (loaded) return;
    const char *path = getenv("QF_FUZZ_VOCAB");
    if (!path || !*path) path = "../shared/data/vocab/ggml-vocab-gpt-2.gguf";
    qf_error e = {0};
    qf_gguf *g = qf_gguf_open(path, &e);
    if (g) tok = qf_tokenizer_load(g, &e);
    qf_gguf_close(g);
    loaded = tok ? 1 : -1;
    if (!tok) fprintf(stderr, "fuzz_tokenizer: no vocab (%s): %s; inputs are skipped\n", path, e.msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    if (loaded < 0) return 0;
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        qf_error e;
        if (qf_tokenize(tok, (const char *)data, size, special, special, &ids, &n, &e) != QF_OK) abort();
        int32_t nv = qf_tokenizer_n_vocab(tok);
        char buf[64];
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= nv) abort();
            int k = qf_token_to_piece(tok, ids[i], special, buf, sizeof buf);
            if (k < 0) abort();
        }
        free(ids);
    }
    return 0;
}
