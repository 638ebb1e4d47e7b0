/* corpus.c: the corpus stage. Reads text sources, normalizes them into documents, splits
 * the documents into disjoint calibration / evaluation parts and hashes them for provenance.
 * The rules are stated in include/qforge/corpus.h and docs/corpus.md; keep the three in step,
 * because the hashes recorded in certified artifacts depend on every byte of them. */
#include "qforge/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

#define MAX_DIR_DEPTH 64
#define BINARY_PROBE 8000 /* git's rule: a NUL in the first 8000 bytes means binary */
static const char EOT[] = "<|endoftext|>";

typedef struct {
    char *text;
    size_t len;
    uint8_t sha[32];
    int part; /* qf_corpus_part, or -1 for a dropped duplicate */
} corpus_doc;

struct qf_corpus {
    size_t doc_kb;
    corpus_doc *docs;
    size_t n_docs, cap_docs;
    char *inputs; /* comma-separated input names */
    size_t inputs_len;
    size_t n_files, n_skipped_binary, n_synth;
    bool finalized;
    qf_corpus_info info;
    char *text[2];
    size_t text_len[2];
    size_t *part_idx[2]; /* indices into docs, input order */
    size_t part_n[2];
};

qf_corpus *qf_corpus_new(void) {
    qf_corpus *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->doc_kb = QF_CORPUS_DEFAULT_DOC_KB;
    c->inputs = calloc(1, 1);
    if (!c->inputs) {
        free(c);
        return NULL;
    }
    return c;
}

void qf_corpus_free(qf_corpus *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_docs; i++) free(c->docs[i].text);
    free(c->docs);
    free(c->inputs);
    for (int p = 0; p < 2; p++) {
        free(c->text[p]);
        free(c->part_idx[p]);
    }
    free(c);
}

static qf_status check_open(qf_corpus *c, qf_error *err) {
    if (!c) return qf_fail(err, QF_ERR_ARG, "corpus: NULL corpus");
    if (c->finalized)
        return qf_fail(err, QF_ERR_ARG, "corpus: already finalized; add inputs before finalize");
    return QF_OK;
}

qf_status qf_corpus_set_doc_kb(qf_corpus *c, size_t kb, qf_error *err) {
    qf_status st = check_open(c, err);
    if (st) return st;
    if (kb > (SIZE_MAX >> 11))
        return qf_fail(err, QF_ERR_ARG, "corpus: doc_kb: %zu KiB is too large", kb);
    c->doc_kb = kb;
    return QF_OK;
}

const char *qf_corpus_inputs(const qf_corpus *c) { return c ? c->inputs : ""; }

static qf_status note_input(qf_corpus *c, const char *name, qf_error *err) {
    size_t n = strlen(name), extra = c->inputs_len ? 2 : 0;
    char *p = realloc(c->inputs, c->inputs_len + extra + n + 1);
    if (!p) return qf_fail(err, QF_ERR_NOMEM, "corpus: out of memory");
    c->inputs = p;
    if (extra) memcpy(p + c->inputs_len, ", ", 2);
    memcpy(p + c->inputs_len + extra, name, n + 1);
    c->inputs_len += extra + n;
    return QF_OK;
}

/* ---- UTF-8 and normalization ---- */

static bool looks_binary(const uint8_t *s, size_t n) {
    if (memchr(s, 0, n < BINARY_PROBE ? n : BINARY_PROBE)) return true;
    size_t bad = 0;
    for (size_t i = 0; i < n;) {
        size_t l = qf_utf8_valid_len(s + i, n - i);
        if (l == 0) bad++, l = 1;
        i += l;
    }
    return bad * 10 > n;
}

/* Normalize (see corpus.h) into `out`, or only measure when out is NULL; returns the length.
 * Measuring first keeps memory at the output size instead of the 3x worst case. */
static size_t normalize_into(const uint8_t *s, size_t n, char *out) {
    size_t o = 0, i = 0;
    if (n >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF) i = 3;
    while (i < n) {
        uint8_t b = s[i];
        if (b == 0) {
            i++;
        } else if (b == '\r') {
            if (out) out[o] = '\n';
            o++;
            i += (i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
        } else {
            size_t l = qf_utf8_valid_len(s + i, n - i);
            if (l == 0) {
                if (out) memcpy(out + o, "\xEF\xBF\xBD", 3);
                o += 3;
                i++;
            } else {
                if (out) memcpy(out + o, s + i, l);
                o += l;
                i += l;
            }
        }
    }
    return o;
}

/* Returns a malloc'd normalized copy, or NULL when out of memory. */
static char *normalize(const uint8_t *s, size_t n, size_t *out_len) {
    size_t len = normalize_into(s, n, NULL);
    char *out = malloc(len + 1);
    if (!out) return NULL;
    normalize_into(s, n, out);
    out[len] = '\0';
    *out_len = len;
    return out;
}

/* ---- documents ---- */

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f';
}

static qf_status add_doc(qf_corpus *c, const char *p, size_t n, qf_error *err) {
    while (n && is_space(*p)) p++, n--;
    while (n && is_space(p[n - 1])) n--;
    if (n == 0) return QF_OK;
    if (c->n_docs == c->cap_docs) {
        size_t cap = c->cap_docs ? c->cap_docs * 2 : 64;
        corpus_doc *d = realloc(c->docs, cap * sizeof *d);
        if (!d) return qf_fail(err, QF_ERR_NOMEM, "corpus: out of memory");
        c->docs = d;
        c->cap_docs = cap;
    }
    corpus_doc *d = &c->docs[c->n_docs];
    d->text = malloc(n + 1);
    if (!d->text) return qf_fail(err, QF_ERR_NOMEM, "corpus: out of memory (%zu bytes)", n);
    memcpy(d->text, p, n);
    d->text[n] = '\0';
    d->len = n;
    d->part = QF_CORPUS_CALIB;
    qf_sha256(d->text, n, d->sha);
    c->n_docs++;
    return QF_OK;
}

/* The first '\n' at or after `from` that ends a paragraph (the next line is blank), or NULL. */
static const char *paragraph_end(const char *from, const char *end) {
    const char *x = from;
    while (x < end && (x = memchr(x, '\n', (size_t)(end - x)))) {
        const char *y = x + 1;
        while (y < end && (*y == ' ' || *y == '\t')) y++;
        if (y < end && *y == '\n') return x;
        x++;
    }
    return NULL;
}

static qf_status add_piece(qf_corpus *c, const char *p, size_t n, qf_error *err) {
    size_t target = c->doc_kb * 1024;
    const char *start = p, *end = p + n;
    while (start < end) {
        const char *cut = NULL;
        if (target && (size_t)(end - start) > target) {
            cut = paragraph_end(start + target, end);
            if (cut && (size_t)(end - cut) < target / 2) cut = NULL; /* a short tail stays */
        }
        const char *stop = cut ? cut : end;
        qf_status st = add_doc(c, start, (size_t)(stop - start), err);
        if (st) return st;
        start = stop;
        if (start < end) start++;
    }
    return QF_OK;
}

/* Normalize raw bytes and turn them into documents. */
static qf_status add_bytes(qf_corpus *c, const char *name, const uint8_t *s, size_t n,
                           qf_error *err) {
    size_t len = 0;
    char *t = normalize(s, n, &len);
    if (!t) return qf_fail(err, QF_ERR_NOMEM, "%s: out of memory normalizing %zu bytes", name, n);
    qf_status st = QF_OK;
    const char *p = t, *end = t + len;
    for (;;) {
        const char *q = memmem(p, (size_t)(end - p), EOT, sizeof EOT - 1);
        const char *stop = q ? q : end;
        if ((st = add_piece(c, p, (size_t)(stop - p), err))) break;
        if (!q) break;
        p = q + sizeof EOT - 1;
    }
    free(t);
    return st;
}

qf_status qf_corpus_add_text(qf_corpus *c, const char *name, const char *text, size_t len,
                             qf_error *err) {
    qf_status st = check_open(c, err);
    if (st) return st;
    if (!name) name = "<text>";
    if (!text && len) return qf_fail(err, QF_ERR_ARG, "%s: NULL text", name);
    if ((st = note_input(c, name, err))) return st;
    return add_bytes(c, name, (const uint8_t *)text, len, err);
}

qf_status qf_corpus_add_stdin(qf_corpus *c, qf_error *err) {
    qf_status st = check_open(c, err);
    if (st) return st;
    char *buf;
    size_t n;
    if ((st = qf_read_file("-", &buf, &n, err))) return qf_error_prefix(err, "stdin: ");
    if (!(st = note_input(c, "<stdin>", err))) st = add_bytes(c, "<stdin>", (uint8_t *)buf, n, err);
    free(buf);
    return st;
}

static qf_status add_file(qf_corpus *c, const char *path, bool in_dir, qf_error *err) {
    qf_mapped_file mf;
    qf_status st = qf_map_file(path, &mf, err);
    if (st) return st;
    if (mf.size && looks_binary(mf.data, mf.size)) {
        qf_unmap_file(&mf);
        if (in_dir) {
            c->n_skipped_binary++;
            return QF_OK;
        }
        return qf_fail(err, QF_ERR_FORMAT,
                       "%s: not a text file (NUL bytes or mostly invalid UTF-8); "
                       "expected UTF-8 text", path);
    }
    c->n_files++;
    st = add_bytes(c, path, mf.data, mf.size, err);
    qf_unmap_file(&mf);
    return st;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name); /* bytewise: the same order in every locale */
}

static int not_hidden(const struct dirent *d) { return d->d_name[0] != '.'; }

static qf_status add_dir(qf_corpus *c, const char *dir, int depth, qf_error *err) {
    if (depth > MAX_DIR_DEPTH)
        return qf_fail(err, QF_ERR_ARG, "%s: directories nested deeper than %d", dir,
                       MAX_DIR_DEPTH);
    struct dirent **names;
    int n = scandir(dir, &names, not_hidden, by_name);
    if (n < 0) return qf_fail(err, QF_ERR_IO, "%s: cannot list directory: %s", dir, strerror(errno));
    qf_status st = QF_OK;
    char path[PATH_MAX];
    for (int i = 0; i < n; i++) {
        if (!st) {
            int w = snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
            struct stat ls, s;
            if (w < 0 || (size_t)w >= sizeof path) {
                st = qf_fail(err, QF_ERR_ARG, "%s/%s: path too long", dir, names[i]->d_name);
            } else if (lstat(path, &ls) != 0) {
                st = qf_fail(err, QF_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
            } else if (stat(path, &s) != 0) {
                /* a dangling symlink is not an input; anything else unreadable is an error */
                if (!S_ISLNK(ls.st_mode))
                    st = qf_fail(err, QF_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
            } else if (S_ISDIR(s.st_mode)) {
                if (!S_ISLNK(ls.st_mode)) st = add_dir(c, path, depth + 1, err); /* no cycles */
            } else if (S_ISREG(s.st_mode)) {
                st = add_file(c, path, true, err);
            }
        }
        free(names[i]);
    }
    free(names);
    return st;
}

qf_status qf_corpus_add_path(qf_corpus *c, const char *path, qf_error *err) {
    qf_status st = check_open(c, err);
    if (st) return st;
    if (!path || !*path) return qf_fail(err, QF_ERR_ARG, "corpus: empty path");
    if (strcmp(path, "-") == 0) return qf_corpus_add_stdin(c, err);
    struct stat s;
    if (stat(path, &s) != 0) return qf_fail(err, QF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if ((st = note_input(c, path, err))) return st;
    if (S_ISDIR(s.st_mode)) {
        /* strip trailing slashes so file names in messages read "dir/x", not "dir//x" */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", path);
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') dir[--n] = '\0';
        return add_dir(c, dir, 0, err);
    }
    if (S_ISREG(s.st_mode)) return add_file(c, path, false, err);
    return qf_fail(err, QF_ERR_ARG, "%s: not a regular file or directory", path);
}

/* ---- the built-in demo corpus ---- */

qf_status qf_corpus_builtin_path(char *out, size_t cap, qf_error *err) {
    char cand[6][PATH_MAX];
    int n = 0;
    const char *env = getenv("QF_ASSETS_DIR");
    if (env && *env) snprintf(cand[n++], PATH_MAX, "%s/%s", env, QF_CORPUS_BUILTIN_REL);
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(cand[n++], PATH_MAX, "%.3800s/../assets/%s", exe, QF_CORPUS_BUILTIN_REL);
        snprintf(cand[n++], PATH_MAX, "%.3800s/../../assets/%s", exe, QF_CORPUS_BUILTIN_REL);
        snprintf(cand[n++], PATH_MAX, "%.3800s/../share/qforge/%s", exe, QF_CORPUS_BUILTIN_REL);
    }
    snprintf(cand[n++], PATH_MAX, "/usr/local/share/qforge/%s", QF_CORPUS_BUILTIN_REL);
    snprintf(cand[n++], PATH_MAX, "/usr/share/qforge/%s", QF_CORPUS_BUILTIN_REL);
    for (int i = 0; i < n; i++) {
        if (access(cand[i], R_OK) != 0) continue;
        char real[PATH_MAX];
        const char *found = realpath(cand[i], real) ? real : cand[i];
        if (out && cap) snprintf(out, cap, "%s", found);
        return QF_OK;
    }
    char tried[900] = "";
    for (int i = 0; i < n; i++) {
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof tried - used, "%s%s", i ? ", " : "", cand[i]);
    }
    return qf_fail(err, QF_ERR_IO,
                   "built-in corpus %s not found (set QF_ASSETS_DIR to the assets directory); "
                   "tried: %s", QF_CORPUS_BUILTIN_REL, tried);
}

qf_status qf_corpus_add_builtin(qf_corpus *c, qf_error *err) {
    qf_status st = check_open(c, err);
    if (st) return st;
    char path[PATH_MAX];
    if ((st = qf_corpus_builtin_path(path, sizeof path, err))) return st;
    return qf_corpus_add_path(c, path, err);
}

/* ---- Ollama synthesis (the HTTP side is in ollama.c) ---- */

static const char *const default_prompts[] = {
    "Write a detailed technical explanation of how an operating system schedules threads.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain, step by step, how to solve a system of two linear equations, with an example.",
    "Write a news-style article about a city that opens a new public library.",
    "Describe the water cycle for a high-school science textbook.",
    "Write a Python function that merges two sorted lists, and explain how it works.",
    "Write a dialogue between two friends planning a weekend hiking trip.",
    "Summarize the causes and consequences of the industrial revolution.",
    "Write a product manual section explaining how to set up a home Wi-Fi router.",
    "Write a recipe for vegetable soup with an introduction and numbered steps.",
    "Explain how public-key cryptography lets two strangers communicate securely.",
    "Write a letter from a traveller describing a busy market in a foreign city.",
};

static qf_status load_prompts(const char *path, char **buf, char ***list, size_t *n,
                              qf_error *err) {
    size_t len;
    qf_status st = qf_read_file(path, buf, &len, err);
    if (st) return qf_error_prefix(err, "--synth-prompts: ");
    size_t cap = 16, k = 0;
    char **v = malloc(cap * sizeof *v);
    if (!v) return qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", path);
    for (char *line = *buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r') line[--l] = '\0';
        bool blank = true;
        for (size_t i = 0; i < l; i++) blank = blank && is_space(line[i]);
        if (!blank) {
            if (k == cap) {
                char **nv = realloc(v, 2 * cap * sizeof *v);
                if (!nv) {
                    free(v);
                    return qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", path);
                }
                v = nv;
                cap *= 2;
            }
            v[k++] = line;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (k == 0) {
        free(v);
        return qf_fail(err, QF_ERR_FORMAT, "%s: no prompts; expected one prompt per line", path);
    }
    *list = v;
    *n = k;
    return QF_OK;
}

qf_status qf_corpus_synthesize_ollama(qf_corpus *c, const qf_ollama_opts *o, qf_error *err) {
    qf_status st = check_open(c, err);
    if (st) return st;
    if (!o || !o->url || !*o->url) return qf_fail(err, QF_ERR_ARG, "ollama: url: expected a URL such as http://127.0.0.1:11434");
    if (!o->model || !*o->model) return qf_fail(err, QF_ERR_ARG, "ollama: model: expected a model name (--ollama-model)");
    if (o->n_docs < 1) return qf_fail(err, QF_ERR_ARG, "ollama: n_docs: expected >= 1, got %d", o->n_docs);
    char *pbuf = NULL, **prompts = (char **)default_prompts;
    size_t n_prompts = sizeof default_prompts / sizeof default_prompts[0];
    if (o->prompts_path && (st = load_prompts(o->prompts_path, &pbuf, &prompts, &n_prompts, err))) {
        free(pbuf);
        return st;
    }
    char name[512];
    snprintf(name, sizeof name, "ollama:%s@%s", o->model, o->url);
    if ((st = note_input(c, name, err))) goto done;
    qf_progress pb;
    qf_progress_begin(&pb, "ollama", o->n_docs);
    for (int i = 0; i < o->n_docs && !st; i++) {
        char *reply = NULL;
        size_t len = 0;
        st = qf_ollama_generate(o, prompts[(size_t)i % n_prompts], i, &reply, &len, err);
        if (!st) {
            size_t before = c->n_docs;
            st = add_bytes(c, name, (const uint8_t *)reply, len, err);
            c->n_synth += c->n_docs - before;
        } else {
            qf_error_prefix(err, "synthesizing document %d of %d: ", i + 1, o->n_docs);
        }
        free(reply);
        qf_progress_update(&pb, i + 1);
    }
    qf_progress_end(&pb);
done:
    if (pbuf) free(prompts);
    free(pbuf);
    return st;
}

/* ---- split, join, hash ---- */

/* Sort keys carry their own hash so the comparator needs no context (qsort_r is not C11). */
typedef struct {
    uint8_t sha[32];
    size_t idx;
} sort_key;

static int by_sha(const void *a, const void *b) {
    const sort_key *x = a, *y = b;
    int r = memcmp(x->sha, y->sha, 32);
    if (r) return r;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static void frame(EVP_MD_CTX *h, const corpus_doc *d) {
    uint8_t le[8];
    uint64_t n = d->len;
    for (int k = 0; k < 8; k++) le[k] = (uint8_t)(n >> (8 * k));
    EVP_DigestUpdate(h, le, 8);
    EVP_DigestUpdate(h, d->text, d->len);
}

static int cmp_size(const void *a, const void *b) {
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return i < j ? -1 : i > j;
}

/* Undo a finalize that ran out of memory half way, so the corpus can be finalized again. */
static qf_status split_oom(qf_corpus *c, size_t *order, qf_error *err) {
    free(order);
    for (int p = 0; p < 2; p++) {
        free(c->text[p]);
        free(c->part_idx[p]);
        c->text[p] = NULL;
        c->part_idx[p] = NULL;
        c->text_len[p] = c->part_n[p] = 0;
    }
    return qf_fail(err, QF_ERR_NOMEM, "corpus: out of memory while splitting");
}

qf_status qf_corpus_finalize(qf_corpus *c, double eval_frac, qf_error *err) {
    qf_status st = check_open(c, err);
    if (st) return st;
    if (!(eval_frac > 0.0 && eval_frac < 1.0))
        return qf_fail(err, QF_ERR_ARG, "corpus: eval_frac: expected a fraction in (0, 1), got %g",
                       eval_frac);
    sort_key *keys = malloc((c->n_docs ? c->n_docs : 1) * sizeof *keys);
    size_t *order = malloc((c->n_docs ? c->n_docs : 1) * sizeof *order);
    if (!keys || !order) {
        free(keys);
        free(order);
        return qf_fail(err, QF_ERR_NOMEM, "corpus: out of memory");
    }
    for (size_t i = 0; i < c->n_docs; i++) {
        memcpy(keys[i].sha, c->docs[i].sha, 32);
        keys[i].idx = i;
    }
    qsort(keys, c->n_docs, sizeof *keys, by_sha);
    size_t n = 0, n_dup = 0;
    for (size_t k = 0; k < c->n_docs; k++) {
        corpus_doc *d = &c->docs[keys[k].idx];
        /* sorted by (sha, index): the first of equal documents is the earliest occurrence */
        if (n) {
            const corpus_doc *prev = &c->docs[order[n - 1]];
            if (memcmp(d->sha, prev->sha, 32) == 0 && d->len == prev->len &&
                memcmp(d->text, prev->text, d->len) == 0) {
                d->part = -1;
                n_dup++;
                continue;
            }
        }
        order[n++] = keys[k].idx;
    }
    free(keys);
    if (n == 0) {
        free(order);
        if (!c->inputs_len) return qf_fail(err, QF_ERR_CORPUS_EMPTY, "corpus: no inputs were given");
        return qf_fail(err, QF_ERR_CORPUS_EMPTY,
                       "corpus: no documents in %.600s (%zu files read, %zu binary files "
                       "skipped); expected non-whitespace text",
                       c->inputs, c->n_files, c->n_skipped_binary);
    }
    size_t n_eval = 0;
    if (n >= 2) {
        double want = floor((double)n * eval_frac + 0.5);
        n_eval = want < 1 ? 1 : want > (double)(n - 1) ? n - 1 : (size_t)want;
    }
    for (size_t k = 0; k < n; k++) c->docs[order[k]].part = k < n_eval ? QF_CORPUS_EVAL : QF_CORPUS_CALIB;
    /* back to input order for the parts */
    qsort(order, n, sizeof *order, cmp_size);

    qf_corpus_info *in = &c->info;
    memset(in, 0, sizeof *in);
    size_t bytes[2] = {0, 0};
    for (size_t k = 0; k < n; k++) {
        corpus_doc *d = &c->docs[order[k]];
        c->part_n[d->part]++;
        bytes[d->part] += d->len;
    }
    for (int p = 0; p < 2; p++) {
        size_t cap = bytes[p] + (c->part_n[p] ? 2 * (c->part_n[p] - 1) : 0);
        c->text[p] = malloc(cap + 1);
        c->part_idx[p] = malloc((c->part_n[p] ? c->part_n[p] : 1) * sizeof(size_t));
        if (!c->text[p] || !c->part_idx[p]) return split_oom(c, order, err);
        c->text[p][0] = '\0';
        c->part_n[p] = 0;
    }
    EVP_MD_CTX *h[3] = {EVP_MD_CTX_new(), EVP_MD_CTX_new(), EVP_MD_CTX_new()};
    for (int k = 0; k < 3; k++) {
        if (!h[k] || !EVP_DigestInit_ex(h[k], EVP_sha256(), NULL)) {
            for (int j = 0; j < 3; j++) EVP_MD_CTX_free(h[j]);
            return split_oom(c, order, err);
        }
    }
    for (size_t k = 0; k < n; k++) {
        corpus_doc *d = &c->docs[order[k]];
        int p = d->part;
        char *t = c->text[p];
        if (c->part_n[p]) {
            memcpy(t + c->text_len[p], "\n\n", 2);
            c->text_len[p] += 2;
        }
        memcpy(t + c->text_len[p], d->text, d->len);
        c->text_len[p] += d->len;
        t[c->text_len[p]] = '\0';
        c->part_idx[p][c->part_n[p]++] = order[k];
        frame(h[0], d);
        frame(h[1 + p], d);
    }
    EVP_DigestFinal_ex(h[0], in->sha256, NULL);
    EVP_DigestFinal_ex(h[1], in->calib_sha256, NULL);
    EVP_DigestFinal_ex(h[2], in->eval_sha256, NULL);
    for (int k = 0; k < 3; k++) EVP_MD_CTX_free(h[k]);
    free(order);
    qf_hex(in->sha256, 32, in->sha256_hex);
    qf_hex(in->calib_sha256, 32, in->calib_sha256_hex);
    qf_hex(in->eval_sha256, 32, in->eval_sha256_hex);
    in->n_docs = n;
    in->n_bytes = bytes[0] + bytes[1];
    in->n_calib_docs = c->part_n[QF_CORPUS_CALIB];
    in->calib_bytes = bytes[QF_CORPUS_CALIB];
    in->n_eval_docs = c->part_n[QF_CORPUS_EVAL];
    in->eval_bytes = bytes[QF_CORPUS_EVAL];
    in->n_files = c->n_files;
    in->n_skipped_binary = c->n_skipped_binary;
    in->n_duplicate_docs = n_dup;
    in->n_synth_docs = c->n_synth;
    in->doc_kb = c->doc_kb;
    in->eval_frac = eval_frac;
    c->finalized = true;
    return QF_OK;
}

const qf_corpus_info *qf_corpus_get_info(const qf_corpus *c) {
    return c && c->finalized ? &c->info : NULL;
}

static const char *part_text(const qf_corpus *c, int p, size_t *len) {
    if (!c || !c->finalized) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = c->text_len[p];
    return c->text[p];
}

const char *qf_corpus_calib_text(const qf_corpus *c, size_t *len) { return part_text(c, QF_CORPUS_CALIB, len); }
const char *qf_corpus_eval_text(const qf_corpus *c, size_t *len) { return part_text(c, QF_CORPUS_EVAL, len); }

size_t qf_corpus_part_docs(const qf_corpus *c, qf_corpus_part part) {
    if (!c || !c->finalized || (part != QF_CORPUS_CALIB && part != QF_CORPUS_EVAL)) return 0;
    return c->part_n[part];
}

const char *qf_corpus_part_doc(const qf_corpus *c, qf_corpus_part part, size_t i, size_t *len) {
    if (i >= qf_corpus_part_docs(c, part)) {
        if (len) *len = 0;
        return NULL;
    }
    const corpus_doc *d = &c->docs[c->part_idx[part][i]];
    if (len) *len = d->len;
    return d->text;
}
