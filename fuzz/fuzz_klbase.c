/* fuzz_klbase.c: libFuzzer harness for the KL-divergence base file (`ppl --kl-divergence-base`,
 * llama-perplexity's "_logits_" format, src/eval/kld.h). Parses the input as a base file;
 * when it is accepted, compares up to 4 chunks of its rows against synthetic logits the way
 * `ppl --kl-divergence` does and finishes the statistics, so ASan/UBSan see every row, token
 * and offset the parser let through. Every refusal must name the file. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/ppl.h"
#include "util/util.h"

#include "eval/kld.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the file is mmapped (page-aligned) in real use: tokens are read as int32 in place */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    qf_kld_base_file b;
    memset(&b, 0, sizeof b);
    qf_error e = {0};
    if (qf_kld_base_parse(&b, buf, size, "fuzz.kl", &e) != QF_OK) {
        if (!strstr(e.msg, "fuzz.kl")) abort();
        free(buf);
        return 0;
    }
    if (b.n_ctx < 2 || b.n_vocab < 1 || b.n_chunk < 1) abort();
    /* bound the work (the synthetic logits are n_score x n_vocab floats) */
    if ((uint64_t)b.n_ctx * (uint64_t)b.n_vocab > (1u << 20)) {
        free(buf);
        return 0;
    }
    for (int64_t i = 0; i < (int64_t)b.n_ctx * b.n_chunk; i++)
        if (b.tokens[i] < 0 || b.tokens[i] >= b.n_vocab) abort(); /* the parser's promise */
    qf_ppl_params p = qf_ppl_default_params();
    p.kl_base_read = "fuzz.kl";
    int n_chunk = b.n_chunk < 4 ? b.n_chunk : 4;
    qf_kld_state k;
    qf_status st = qf_kld_begin(&k, &p, b.n_ctx, b.n_vocab, n_chunk, n_chunk, &b, b.tokens, &e);
    if (st == QF_OK && k.n_score > 0) {
        const int first = b.n_ctx / 2;
        float *logits = malloc((size_t)k.n_score * b.n_vocab * sizeof(float));
        qf_kld_pos *pos = malloc((size_t)k.n_score * sizeof *pos);
        if (logits && pos) {
            for (size_t i = 0; i < (size_t)k.n_score * b.n_vocab; i++) logits[i] = (float)(i % 97) * 0.25f - 12.f;
            for (int c = 0; c < n_chunk && st == QF_OK; c++) {
                st = qf_kld_chunk(&k, logits, b.tokens + (size_t)c * b.n_ctx + first + 1, k.n_score, c, NULL, pos, NULL,
                                  &e);
                if (st == QF_OK) qf_kld_accumulate(&k, pos, k.n_score);
            }
            qf_ppl_result r;
            memset(&r, 0, sizeof r);
            if (st == QF_OK) st = qf_kld_finish(&k, &r, &e);
        }
        free(logits);
        free(pos);
    }
    qf_kld_end(&k);
    free(buf);
    return 0;
}
