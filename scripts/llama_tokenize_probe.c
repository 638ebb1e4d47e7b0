/* llama_tokenize_probe.c (ours): tokenize TEXT with llama.cpp's vocabulary loader (vocab only),
 * add_special false; a third argument turns special-token parsing on. Prints the ids as
 * `qforge tokenize --ids --no-bos` does, for the parity sweep in docs/tokenizer.md. Build against
 * a llama.cpp build (not part of qforge):
 *   gcc -I$LLAMA/include -I$LLAMA/ggml/include scripts/llama_tokenize_probe.c -L$LLAMA/build/bin -lllama \
 *       -Wl,-rpath,$LLAMA/build/bin -o /tmp/lltok */
#include <stdio.h>
#include <string.h>
#include "llama.h"
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int parse_special = argc > 3;
    llama_token toks[4096];
    int n = llama_tokenize(v, argv[2], (int)strlen(argv[2]), toks, 4096, false, parse_special);
    printf("[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", toks[i]);
    printf("]\n");
    llama_model_free(m);
    return 0;
}
