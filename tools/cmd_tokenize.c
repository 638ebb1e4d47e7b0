/* cmd_tokenize.c: `qforge tokenize -m MODEL (-p TEXT | -f FILE | --stdin) [--ids] [--no-bos]
 * [--parse-special]`: a model's tokenization of a text, printed as llama-tokenize prints it
 * (one `id -> 'piece'` line per token, or the ids as one "[1, 2, 3]" line with --ids). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/gguf.h"
#include "qforge/tokenizer.h"
#include "qforge/util.h"

#define TOKENIZE_USAGE \
    "qforge tokenize -m MODEL.gguf (-p TEXT | -f FILE | --stdin) [--ids] [--no-bos] [--parse-special]"

/* llama-tokenize marks a piece that is not valid UTF-8 on its own (a partial character) */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t j = 1; j < len; j++)
            if ((s[i + j] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

int qf_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *model = NULL, *prompt = NULL, *file = NULL;
    bool use_stdin = false, ids_only = false, no_bos = false, parse_special = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: %s\n", TOKENIZE_USAGE);
            return 0;
        }
        if ((r = cli_flag_value(argc, argv, &i, "--model", "-m", &model))) {
            if (r < 0) return cli_usage(cmd, TOKENIZE_USAGE, "%s needs a value", a);
        } else if ((r = cli_flag_value(argc, argv, &i, "--prompt", "-p", &prompt))) {
            if (r < 0) return cli_usage(cmd, TOKENIZE_USAGE, "%s needs a value", a);
        } else if ((r = cli_flag_value(argc, argv, &i, "--file", "-f", &file))) {
            if (r < 0) return cli_usage(cmd, TOKENIZE_USAGE, "%s needs a value", a);
        } else if (!strcmp(a, "--stdin")) {
            use_stdin = true;
        } else if (!strcmp(a, "--ids")) {
            ids_only = true;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--parse-special")) {
            parse_special = true;
        } else {
            return cli_usage(cmd, TOKENIZE_USAGE, "unknown argument '%s'", a);
        }
    }
    if (!model) return cli_usage(cmd, TOKENIZE_USAGE, "-m MODEL is required");
    if ((prompt != NULL) + (file != NULL) + use_stdin != 1)
        return cli_usage(cmd, TOKENIZE_USAGE, "give exactly one of -p, -f, --stdin");

    qf_error e = {0};
    char *text = NULL;
    size_t len = 0;
    if (prompt) {
        len = strlen(prompt);
        text = malloc(len + 1);
        if (!text) {
            qf_fail(&e, QF_ERR_NOMEM, "out of memory");
            return cli_fail(cmd, &e);
        }
        memcpy(text, prompt, len + 1);
    } else if (qf_read_file(file ? file : "-", &text, &len, &e) != QF_OK) {
        return cli_fail(cmd, &e);
    }

    qf_gguf *g = qf_gguf_open(model, &e);
    if (!g) {
        free(text);
        return cli_fail(cmd, &e);
    }
    qf_tokenizer *t = qf_tokenizer_load(g, &e);
    qf_gguf_close(g);
    if (!t) {
        free(text);
        return cli_fail(cmd, &e);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    bool add_bos = qf_tokenizer_add_bos(t) && !no_bos;
    if (qf_tokenize(t, text, len, add_bos, parse_special, &ids, &n, &e) != QF_OK) {
        free(text);
        qf_tokenizer_free(t);
        return cli_fail(cmd, &e);
    }
    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        puts("]");
    } else {
        char small[256];
        for (size_t i = 0; i < n; i++) {
            int k = qf_token_to_piece(t, ids[i], true, small, sizeof small);
            char *piece = small;
            if (k > (int)sizeof small) {
                piece = malloc((size_t)k);
                if (!piece) break;
                qf_token_to_piece(t, ids[i], true, piece, (size_t)k);
            }
            printf("%6d -> '", ids[i]);
            fwrite(piece, 1, (size_t)(k > 0 ? k : 0), stdout);
            puts(valid_utf8((const unsigned char *)piece, (size_t)(k > 0 ? k : 0)) ? "'" : "' (UTF-8 decode failure)");
            if (piece != small) free(piece);
        }
    }
    free(ids);
    free(text);
    qf_tokenizer_free(t);
    return 0;
}
