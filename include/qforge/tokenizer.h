/* qforge/tokenizer.h: SentencePiece (`llama`) and byte-level BPE (`gpt2`) tokenizers built
 * from GGUF metadata (tokenizer.ggml.*), matching llama.cpp's output id for id. */
#ifndef QFORGE_TOKENIZER_H
#define QFORGE_TOKENIZER_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/error.h"
#include "qforge/gguf.h"

typedef struct qf_tokenizer qf_tokenizer;

/* Build from an opened GGUF file (the file may be closed afterwards: everything is copied). */
QF_API qf_tokenizer *qf_tokenizer_load(const qf_gguf *g, qf_error *err);
QF_API void qf_tokenizer_free(qf_tokenizer *t);

QF_API int32_t qf_tokenizer_n_vocab(const qf_tokenizer *t);
QF_API int32_t qf_tokenizer_bos(const qf_tokenizer *t); /* -1 if none */
QF_API int32_t qf_tokenizer_eos(const qf_tokenizer *t); /* -1 if none */
QF_API bool qf_tokenizer_add_bos(const qf_tokenizer *t); /* tokenizer.ggml.add_bos_token, or the type's default */
QF_API const char *qf_tokenizer_model(const qf_tokenizer *t); /* "llama" or "gpt2" */
QF_API const char *qf_tokenizer_pre(const qf_tokenizer *t);   /* tokenizer.ggml.pre, or "default" */

/* Tokenize `len` bytes of UTF-8 (invalid UTF-8 is handled as llama.cpp does, never a crash).
 * add_bos: prepend BOS when the vocab has one. parse_special: recognise control/user-defined
 * token text in the input (llama.cpp's parse_special). *out is malloc'd; caller frees. */
QF_API qf_status qf_tokenize(const qf_tokenizer *t, const char *text, size_t len, bool add_bos,
                      bool parse_special, int32_t **out, size_t *n_out, qf_error *err);

/* The bytes a token decodes to (byte-level and SPM ▁ handling undone; control tokens give
 * their text only when `special` is true). Writes up to cap bytes and returns the full length,
 * or -1 for an invalid id. */
QF_API int qf_token_to_piece(const qf_tokenizer *t, int32_t id, bool special, char *buf, size_t cap);

#endif
