/* fuzz_corpus.c: libFuzzer harness for the corpus stage's text handling: UTF-8 validation and
 * normalization (BOM, CR/CRLF, NUL, invalid sequences -> U+FFFD), document splitting and the
 * calibration/evaluation split. The input is added as one text source (with a small paragraph
 * size so splitting runs) and finalized; the result must be what corpus.h promises: valid
 * UTF-8 (checked here independently, strictly), no NUL and no CR, every byte of every document
 * readable. Also walks the input with the tokenizers' decoder (qf_utf8_next), which must
 * advance and stay in bounds on any bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/corpus.h"
#include "text/unicode.h"

/* As in fuzz_tokenizer.c: ASan's 256 MiB quarantine and 4 KiB malloc fill made every input pay
 * for fresh pages; 16 MiB of quarantine still outlives anything one input frees, the fill
 * detects nothing by itself. ASAN_OPTIONS in the environment still overrides. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=16:max_malloc_fill_size=0"; }

static volatile uint64_t sink;

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t b = s[i];
        if (b == 0 || b == '\r') return 0;
        if (b < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp;
        if (b >= 0xC2 && b <= 0xDF) len = 2, cp = b & 0x1F;
        else if (b >= 0xE0 && b <= 0xEF) len = 3, cp = b & 0x0F;
        else if (b >= 0xF0 && b <= 0xF4) len = 4, cp = b & 0x07;
        else return 0;
        if (n - i < len) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
        if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
        i += len;
    }
    return 1;
}

static void check_part(const qf_corpus *c, qf_corpus_part part) {
    size_t n = qf_corpus_part_docs(c, part);
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        const char *d = qf_corpus_part_doc(c, part, i, &len);
        if (!d) abort();
        if (!valid_utf8((const uint8_t *)d, len)) abort();
        if (len) sink += (uint8_t)d[0] + (uint8_t)d[len - 1];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (size_t off = 0; off < size;) {
        size_t before = off;
        sink += qf_utf8_next(data, size, &off);
        if (off <= before || off > size) abort();
    }
    qf_corpus *c = qf_corpus_new();
    if (!c) return 0;
    qf_error e = {0};
    if (qf_corpus_set_doc_kb(c, 1, &e) == QF_OK &&
        qf_corpus_add_text(c, "fuzz.txt", (const char *)data, size, &e) == QF_OK &&
        qf_corpus_finalize(c, 0.5, &e) == QF_OK) {
        size_t lc = 0, le = 0;
        const char *ct = qf_corpus_calib_text(c, &lc), *et = qf_corpus_eval_text(c, &le);
        if ((lc && !ct) || (le && !et)) abort();
        if (ct && !valid_utf8((const uint8_t *)ct, lc)) abort();
        if (et && !valid_utf8((const uint8_t *)et, le)) abort();
        check_part(c, QF_CORPUS_CALIB);
        check_part(c, QF_CORPUS_EVAL);
        if (!qf_corpus_get_info(c)) abort();
    }
    qf_corpus_free(c);
    return 0;
}
