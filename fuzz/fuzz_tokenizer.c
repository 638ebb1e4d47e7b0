/* fuzz_tokenizer.c: libFuzzer harness for the tokenizers. Loads one vocabulary once
 * ($QF_FUZZ_VOCAB, default ../shared/data/vocab/ggml-vocab-gpt-2.gguf, else the embedded demo
 * model's; every input is a no-op when none loads), then tokenizes the input bytes (the first byte chooses parse_special)
 * and decodes every id, so ASan/UBSan see the whole path on arbitrary (invalid) UTF-8. */
#include <stdbool.h>
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
    if (!g && !getenv("QF_FUZZ_VOCAB")) /* a fresh clone has no ../shared: the demo model's vocab */
        g = qf_gguf_open(path = "assets/models/qforge-demo-11m-f16.gguf", &e);
    if (g) tok = qf_tokenizer_load(g, &e);
    qf_gguf_close(g);
    loaded = tok ? 1 : -1;
    if (!tok) fprintf(stderr, "fuzz_tokenizer: no vocab (%s): %s; inputs are skipped\n", path, e.msg);
}

/* Load the vocabulary before the first input: instrumented, loading gpt-2's 50k merges takes
 * seconds on a busy machine, which would count against the first input's -timeout. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    load_once();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    if (loaded < 0 || size == 0) return 0;
    /* The first byte picks parse_special / add_bos, the rest is the text: one tokenization per
     * input (not two), and at most 1 KiB of text. Profiled (docs/fuzzing.md): the vocabulary is
     * loaded once; the cost is per byte of text (~1 us/byte at -O2, ~10x that under
     * ASan+UBSan+coverage), so long inputs, not loading, are what made runs slow. Tokenizer
     * bugs are local (a UTF-8 sequence, a special token, a merge), so 1 KiB loses nothing. */
    const bool special = data[0] & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1 < 1024 ? size - 1 : 1024;
    int32_t *ids = NULL;
    size_t n = 0;
    qf_error e;
    if (qf_tokenize(tok, text, len, special, special, &ids, &n, &e) != QF_OK) abort();
    int32_t nv = qf_tokenizer_n_vocab(tok);
    char buf[64];
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= nv) abort();
        int k = qf_token_to_piece(tok, ids[i], special, buf, sizeof buf);
        if (k < 0) abort();
    }
    free(ids);
    return 0;
}
