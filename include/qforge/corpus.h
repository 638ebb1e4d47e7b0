/* qforge/corpus.h: the corpus stage of the forge. Gathers text (files, directories, stdin,
 * the built-in demo corpus, a local Ollama server), normalizes it into documents, splits the
 * documents deterministically into a calibration part and a disjoint evaluation part, and
 * hashes everything for provenance. The capture stage reads the calibration text, the certify
 * stage the evaluation text; the package stage records the hashes. docs/corpus.md has the rules.
 *
 *   qf_corpus *c = qf_corpus_new();
 *   qf_corpus_add_path(c, "docs/", &err);          // or _add_builtin, _add_stdin, _add_text
 *   qf_corpus_finalize(c, QF_CORPUS_DEFAULT_EVAL_FRAC, &err);  // QF_ERR_CORPUS_EMPTY if nothing
 *   const qf_corpus_info *info = qf_corpus_get_info(c);
 *   size_t n; const char *calib = qf_corpus_calib_text(c, &n);
 *   qf_corpus_free(c);
 *
 * Normalization (every source): invalid UTF-8 is replaced, never rejected: each byte that
 * does not begin a valid sequence becomes U+FFFD; a leading BOM is dropped; NUL bytes are
 * dropped; CRLF and lone CR become LF. Document rules: text is cut at every "<|endoftext|>"
 * (the marker is dropped); a piece longer than doc_kb KiB is cut at blank-line paragraph
 * boundaries into pieces of about doc_kb KiB (never inside a paragraph; a tail shorter than
 * half of that joins the piece before it); each document is trimmed of surrounding
 * whitespace and dropped if nothing is left; exact duplicates keep their first occurrence. */
#ifndef QFORGE_CORPUS_H
#define QFORGE_CORPUS_H

#include "qforge/api.h"
#include <stddef.h>
#include <stdint.h>

#include "qforge/error.h"

#define QF_CORPUS_DEFAULT_DOC_KB 8       /* target size of paragraph-split documents */
#define QF_CORPUS_DEFAULT_EVAL_FRAC 0.2  /* share of documents held out for evaluation */
#define QF_CORPUS_BUILTIN_REL "corpora/kerneldoc-demo/docs.txt" /* under the assets dir */

typedef struct qf_corpus qf_corpus;

typedef enum { QF_CORPUS_CALIB = 0, QF_CORPUS_EVAL = 1 } qf_corpus_part;

/* Filled by qf_corpus_finalize. "bytes" counts normalized document bytes; the joined texts
 * add "\n\n" between documents. Hashes are SHA-256 over the documents in order, each framed
 * as its length (8 bytes, little-endian) followed by its bytes: sha256 over all documents
 * (calibration and evaluation interleaved in input order), calib/eval over each part. */
typedef struct {
    size_t n_docs, n_bytes;
    size_t n_calib_docs, calib_bytes;
    size_t n_eval_docs, eval_bytes;
    size_t n_files;            /* files read (directories expanded) */
    size_t n_skipped_binary;   /* files inside directories skipped as binary */
    size_t n_duplicate_docs;   /* exact duplicates dropped */
    size_t n_synth_docs;       /* documents that came from Ollama */
    size_t doc_kb;
    double eval_frac;
    uint8_t sha256[32], calib_sha256[32], eval_sha256[32];
    char sha256_hex[65], calib_sha256_hex[65], eval_sha256_hex[65];
} qf_corpus_info;

QF_API qf_corpus *qf_corpus_new(void); /* NULL when out of memory */
QF_API void qf_corpus_free(qf_corpus *c);

/* Paragraph-split size in KiB for later additions; 0 never splits (only "<|endoftext|>"). */
QF_API qf_status qf_corpus_set_doc_kb(qf_corpus *c, size_t kb, qf_error *err);

/* A file or a directory. Directories are walked recursively in byte-wise sorted order;
 * names starting with '.' and symlinked directories are skipped, and so are files that look
 * binary (a NUL byte in the first 8000 bytes, or more than 10% of bytes not valid UTF-8).
 * A file named directly that looks binary is an error (QF_ERR_FORMAT). "-" is stdin. */
QF_API qf_status qf_corpus_add_path(qf_corpus *c, const char *path, qf_error *err);
QF_API qf_status qf_corpus_add_stdin(qf_corpus *c, qf_error *err);
/* Any bytes (normalized like a file); `name` labels it in messages. */
QF_API qf_status qf_corpus_add_text(qf_corpus *c, const char *name, const char *text, size_t len,
                             qf_error *err);

/* The demo corpus, found at: $QF_ASSETS_DIR/<rel>; else next to the running executable
 * (<exe dir>/../assets/<rel>, <exe dir>/../../assets/<rel>, <exe dir>/../share/qforge/<rel>);
 * else /usr/local/share/qforge/<rel>, /usr/share/qforge/<rel>. Writes the path found into
 * `path` (may be NULL). QF_ERR_IO naming every place tried when none has it. */
QF_API qf_status qf_corpus_builtin_path(char *path, size_t cap, qf_error *err);
QF_API qf_status qf_corpus_add_builtin(qf_corpus *c, qf_error *err);

/* ---- synthesis through a local Ollama server (forge-side only; never used to run models) ---- */
typedef struct {
    const char *url;          /* base URL, e.g. "http://127.0.0.1:11434" */
    const char *model;        /* e.g. "llama3.2" */
    int n_docs;               /* documents to generate (>= 1) */
    const char *prompts_path; /* one prompt per line, blank lines ignored, cycled; NULL = built in */
    long connect_timeout_ms;  /* 0 = 2000 */
    long timeout_s;           /* whole request, 0 = 600 */
} qf_ollama_opts;

/* POST <url>/api/generate {"model":M,"prompt":P,"stream":false,"options":{"seed":seed}} and
 * return the reply's "response" string (malloc'd, NUL-terminated). Unreachable server, HTTP
 * 4xx/5xx: QF_ERR_OLLAMA_UNAVAILABLE naming the URL (with Ollama's "error" text when given);
 * a reply that is not JSON or has no string "response": QF_ERR_FORMAT. Proxies are not used. */
QF_API qf_status qf_ollama_generate(const qf_ollama_opts *o, const char *prompt, long seed, char **out,
                             size_t *out_len, qf_error *err);

/* n_docs requests, prompt i = prompts[i % n_prompts], seed i; each reply becomes documents
 * by the rules above. Stops at the first error. */
QF_API qf_status qf_corpus_synthesize_ollama(qf_corpus *c, const qf_ollama_opts *o, qf_error *err);

/* ---- split and results ---- */

/* Drop duplicates, then hold out round(n * eval_frac) documents for evaluation, at least 1
 * and at most n - 1 when n >= 2 (a 1-document corpus is all calibration). The held-out ones
 * are those whose SHA-256 is smallest, so the choice depends only on the documents, not on
 * their order; each part keeps input order. eval_frac must be in (0, 1). No documents (or
 * only whitespace): QF_ERR_CORPUS_EMPTY naming the inputs. Call once; no additions after. */
QF_API qf_status qf_corpus_finalize(qf_corpus *c, double eval_frac, qf_error *err);

/* After finalize (NULL / 0 before). Texts are the part's documents joined with "\n\n". */
QF_API const qf_corpus_info *qf_corpus_get_info(const qf_corpus *c);
QF_API const char *qf_corpus_calib_text(const qf_corpus *c, size_t *len);
QF_API const char *qf_corpus_eval_text(const qf_corpus *c, size_t *len);
QF_API size_t qf_corpus_part_docs(const qf_corpus *c, qf_corpus_part part);
QF_API const char *qf_corpus_part_doc(const qf_corpus *c, qf_corpus_part part, size_t i, size_t *len);

/* The inputs added so far, comma-separated, for messages and provenance. */
QF_API const char *qf_corpus_inputs(const qf_corpus *c);

#endif
