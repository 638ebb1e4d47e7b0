/* llama_logits_probe.c (ours): run a family fixture (tests/fixtures/families/<fam>.gguf) through
 * llama.cpp and compare its logits with the transformers reference <fam>.logits, the way
 * test_families.c compares qforge's: normalized MSE and top-1 agreement over the 128 tokens, one
 * batch, f32 KV cache, no flash attention. Build against a llama.cpp build (not part of qforge):
 *   gcc -I$LLAMA/include -I$LLAMA/ggml/include scripts/llama_logits_probe.c -L$LLAMA/build/bin -lllama \
 *       -Wl,-rpath,$LLAMA/build/bin -lm -o /tmp/lllogits
 *   /tmp/lllogits tests/fixtures/families/gemma2.gguf tests/fixtures/families/gemma2.logits */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf REF.logits\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    char magic[4];
    uint32_t hdr[3];
    if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "QFLG", 4) || fread(hdr, 4, 3, f) != 3) return 1;
    int n = (int)hdr[1], V = (int)hdr[2];
    int32_t *tok = malloc((size_t)n * 4);
    float *ref = malloc((size_t)n * V * 4);
    if (fread(tok, 4, (size_t)n, f) != (size_t)n || fread(ref, 4, (size_t)n * V, f) != (size_t)n * V) return 1;
    fclose(f);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = cp.n_ubatch = 256;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn = false;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) return 1;
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = tok[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(c, b)) return 1;
    double se = 0, ss = 0;
    int agree = 0;
    for (int t = 0; t < n; t++) {
        const float *x = llama_get_logits_ith(c, t), *y = ref + (size_t)t * V;
        int ax = 0, ay = 0;
        for (int i = 0; i < V; i++) {
            se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            ss += (double)y[i] * y[i];
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        agree += ax == ay;
    }
    printf("llama.cpp vs transformers: nMSE %.3e top-1 %.4f (%d tokens)\n", se / ss, (double)agree / n, n);
    llama_batch_free(b);
    llama_free(c);
    llama_model_free(m);
    free(tok);
    free(ref);
    return 0;
}
