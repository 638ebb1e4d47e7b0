/* fuzz_tokenizer.c: libFuzzer harness for the tokenizers. Loads its vocabularies ONCE, before the
 * first input: $QF_FUZZ_VOCAB (one path, or several separated by ':'), else the llama.cpp
 * vocabularies of ../shared/data/vocab that cover the three tokenizer paths (gpt-2: byte-level
 * BPE with a custom split; llama-spm: SentencePiece with byte fallback; deepseek-llm: BPE with
 * PCRE2 splits and 2398 user-defined special tokens), else the embedded demo model's (a fresh
 * clone). A vocabulary that does not load is left out with a note; with none every input is a
 * no-op. Each input: its first byte picks the vocabulary (bits 1..7) and parse_special/add_bos
 * (bit 0), the rest (at most 1 KiB) is tokenized once and every id decoded, so ASan/UBSan see
 * the whole path on arbitrary (invalid) UTF-8. Invariants: tokenization succeeds, ids are in
 * range, every id decodes. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/gguf.h"
#include "qforge/tokenizer.h"

#define MAX_VOCABS 8

static qf_tokenizer *toks[MAX_VOCABS];
static int n_toks;
static int loaded; /* 0 not tried, 1 tried */

/* ASan's defaults made every input pay for fresh pages: a 256 MiB quarantine cycles all freed
 * memory through new pages, and each malloc is filled with 0xbe up to 4 KiB (perf: page faults
 * and memset were ~20% of the time, 3x the executions/s without them). 16 MiB of quarantine is
 * still far more than one input frees (use-after-free within an input and across the next ones
 * is caught); the fill only makes reads of uninitialized memory deterministic and detects
 * nothing by itself (that is MSan's job). ASAN_OPTIONS in the environment still overrides. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=16:max_malloc_fill_size=0"; }

static void load_one(const char *path) {
    if (n_toks >= MAX_VOCABS) return;
    qf_error e = {0};
    qf_gguf *g = qf_gguf_open(path, &e);
    qf_tokenizer *t = g ? qf_tokenizer_load(g, &e) : NULL;
    qf_gguf_close(g);
    if (t) toks[n_toks++] = t;
    else fprintf(stderr, "fuzz_tokenizer: vocabulary %s left out: %s\n", path, e.msg);
}

static void load_once(void) {
    if (loaded) return;
    loaded = 1;
    const char *env = getenv("QF_FUZZ_VOCAB");
    if (env && *env) {
        char *list = strdup(env);
        for (char *save = NULL, *p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save)) load_one(p);
        free(list);
    } else {
        static const char *const shared[] = {"gpt-2", "llama-spm", "deepseek-llm"};
        for (size_t i = 0; i < sizeof shared / sizeof *shared; i++) {
            char path[256];
            snprintf(path, sizeof path, "../shared/data/vocab/ggml-vocab-%s.gguf", shared[i]);
            FILE *f = fopen(path, "rb");
            if (!f) continue;
            fclose(f);
            load_one(path);
        }
        if (n_toks == 0) load_one("assets/models/qforge-demo-11m-f16.gguf"); /* a fresh clone */
    }
    fprintf(stderr, "fuzz_tokenizer: %d vocabularies loaded\n", n_toks);
}

/* Load the vocabularies before the first input: instrumented, loading gpt-2's 50k merges takes
 * seconds on a busy machine, which would count against the first input's -timeout. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    load_once();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    if (n_toks == 0 || size == 0) return 0;
    /* one tokenization per input, of at most 1 KiB: profiled (docs/hostile-input.md), the
     * cost is per byte of text, and tokenizer bugs are local (a UTF-8 sequence, a special
     * token, a merge), so longer texts find nothing shorter ones cannot */
    const bool special = data[0] & 1;
    const qf_tokenizer *tok = toks[(data[0] >> 1) % n_toks];
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
