/* tokenizer.c: the SentencePiece (`llama`) and byte-level BPE (`gpt2`) tokenizers, built from
 * GGUF tokenizer.ggml.* metadata. llama.cpp (src/llama-vocab.cpp, src/unicode.cpp) is the spec:
 * the same special-token partition, the same pre-tokenizer regexes per tokenizer.ggml.pre (its
 * hand-written splitters for the gpt2 and llama3 patterns, PCRE2 for the rest), the same merge
 * order and tie-breaks, the same handling of invalid UTF-8. The vocab tests check it id for id. */
#include "qforge/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "text/unicode.h"

enum { TYPE_SPM, TYPE_BPE };

/* token attributes, as llama.cpp's llama_token_attr */
enum {
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
    ATTR_LSTRIP = 1 << 7,
    ATTR_RSTRIP = 1 << 8,
};

/* a pre-tokenizer pattern llama.cpp does not run as a regex but with a hand-written splitter */
enum { SPLIT_REGEX, SPLIT_GPT2, SPLIT_LLAMA3 };

#define MAX_REGEX 8

typedef struct {
    uint32_t off, len; /* into the string pool */
    float score;
    uint32_t attr;
} token;

typedef struct {
    uint32_t a_off, a_len, b_off, b_len; /* into the merge pool */
} merge;

struct qf_tokenizer {
    int type;
    char model[16];
    char pre[64];
    int32_t n_vocab;
    token *tok;
    char *pool;
    int32_t *tok_ht; /* open addressing over token text: id, -1 = empty */
    uint64_t tok_mask;

    merge *merges;
    char *mpool;
    int32_t n_merges;
    int32_t *merge_ht; /* rank, -1 = empty */
    uint64_t merge_mask;

    int32_t bos, eos, unk;
    bool add_bos, add_space_prefix, ignore_merges;
    int32_t byte_tok[256]; /* SPM byte fallback */

    int32_t *special; /* CONTROL / USER_DEFINED / UNKNOWN ids, longest text first */
    size_t n_special;

    int n_re;
    int split[MAX_REGEX];
    pcre2_code *re[MAX_REGEX];

    uint8_t b2u[256][2]; /* GPT-2 byte -> printable codepoint, UTF-8 (1 or 2 bytes) */
    uint8_t b2u_len[256];
    int16_t u2b[0x144];  /* the inverse, by codepoint; -1 where none */
};

/* ---- pre-tokenizer patterns (llama.cpp llm_tokenizer_bpe) ---- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                             \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                              \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK "[一-龥ࠀ-一가-퟿]+"
#define RE_PORO " ?[^(\\s|.,!?…。，、।۔،)]+"

typedef struct {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    bool add_bos, ignore_merges;
    const char *re[MAX_REGEX];
} pre_spec;

static const pre_spec pre_specs[] = {
    {"default", false, false,
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2", true, true, {RE_LLAMA3}},
    {"dbrx|smaug-bpe|chatglm-bpe|glm4", false, false, {RE_LLAMA3}},
    {"deepseek-llm", false, false,
     {"[\r\n]",
      "\\s?["
      "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
      "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}"
      "\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}"
      "\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
      "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}"
      "\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}"
      "\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}"
      "\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
      "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
      "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
      "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}"
      "\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
      "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}"
      "\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"
      "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"
      "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"
      "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
      "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}"
      "\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}"
      "]+",      "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", RE_CJK, "\\p{N}+"}},
    {"deepseek-coder", false, false,
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}},
    {"deepseek-v3", false, false,
     {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    {"falcon", false, false, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", false, false,
     {"\\p{N}", RE_GPT2}},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|jina-v1-en|"
     "jina-v2-code|roberta-bpe|mpt|olmo|jais|trillion|exaone4",
     false, false, {RE_GPT2}},
    {"qwen2|deepseek-r1-qwen|megrez|stablelm2|hunyuan|kormo", false, false, {RE_QWEN2}},
    {"poro-chat|bloom|gpt3-finnish", false, false, {RE_PORO}},
    {"viking", false, false, {RE_PORO, "\\p{N}"}},
    {"tekken", true, true,
     {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=["
      "\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+"}},
    {"gpt-4o|llama4", false, false,
     {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'["
      "vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-"
      "Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]"
      "+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"chameleon", true, false,
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2}},
    {"seed-coder", false, false,
     {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{"
      "1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"bailingmoe|bailingmoe2|llada-moe", false, false,
     {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
      "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
};

static bool name_in_list(const char *name, const char *list) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

/* ---- hash tables ---- */

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static int32_t tok_find(const qf_tokenizer *t, const void *s, size_t n) {
    uint64_t i = XXH3_64bits(s, n) & t->tok_mask;
    for (;; i = (i + 1) & t->tok_mask) {
        int32_t id = t->tok_ht[i];
        if (id < 0) return -1;
        if (t->tok[id].len == n && memcmp(t->pool + t->tok[id].off, s, n) == 0) return id;
    }
}

static uint64_t merge_hash(const void *a, size_t an, const void *b, size_t bn) {
    return XXH3_64bits_withSeed(b, bn, XXH3_64bits(a, an));
}

static int32_t merge_rank(const qf_tokenizer *t, const char *a, size_t an, const char *b, size_t bn) {
    if (!t->merge_ht) return -1;
    uint64_t i = merge_hash(a, an, b, bn) & t->merge_mask;
    for (;; i = (i + 1) & t->merge_mask) {
        int32_t r = t->merge_ht[i];
        if (r < 0) return -1;
        const merge *m = &t->merges[r];
        if (m->a_len == an && m->b_len == bn && memcmp(t->mpool + m->a_off, a, an) == 0 &&
            memcmp(t->mpool + m->b_off, b, bn) == 0)
            return r;
    }
}

/* ---- loading ---- */

static const char *tok_text(const qf_tokenizer *t, int32_t id) { return t->pool + t->tok[id].off; }

static bool tok_is(const qf_tokenizer *t, int32_t id, const char *s) {
    size_t n = strlen(s);
    return t->tok[id].len == n && memcmp(tok_text(t, id), s, n) == 0;
}

/* llama.cpp forces these texts to CONTROL whatever their stored type (EOT/EOG/FIM detection).
 * Not "</s>": llama.cpp (b4748, the parity build) leaves it as stored, so phi-3's `</s>`, a
 * USER_DEFINED token (type 4), is matched in plain text without special-token parsing (and
 * strips the whitespace after it, phi-3's RSTRIP). */
static const char *const control_looking[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>", "<|eom_id|>",
    "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "[EOS]", "<eos>", "<turn|>",
    "<|tool_response>", "[e~[",
};
static const char *const fim_looking[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>",
    "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
};

static int u64_cmp(const void *pa, const void *pb) {
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return a < b ? -1 : a > b;
}

static void build_byte_maps(qf_tokenizer *t) {
    bool direct[256] = {false};
    for (int c = 0x21; c <= 0x7E; c++) direct[c] = true;
    for (int c = 0xA1; c <= 0xAC; c++) direct[c] = true;
    for (int c = 0xAE; c <= 0xFF; c++) direct[c] = true;
    for (int i = 0; i < 0x144; i++) t->u2b[i] = -1;
    int n = 0;
    for (int c = 0; c < 256; c++) {
        uint32_t cpt = direct[c] ? (uint32_t)c : (uint32_t)(256 + n++);
        uint8_t buf[4];
        t->b2u_len[c] = (uint8_t)qf_utf8_encode(cpt, buf);
        memcpy(t->b2u[c], buf, t->b2u_len[c]);
        t->u2b[cpt] = (int16_t)c;
    }
}

static qf_status arr_of(const qf_gguf *g, const char *key, qf_gguf_type elem, bool required,
                        const qf_gguf_value **out, qf_error *err) {
    const qf_gguf_value *v = qf_gguf_find(g, key);
    *out = NULL;
    if (!v) {
        if (required)
            return qf_fail(err, QF_ERR_FORMAT, "%s: %s: missing (the tokenizer needs it)",
                           qf_gguf_path(g), key);
        return QF_OK;
    }
    if (v->type != QF_GGUF_ARRAY || v->v.arr.elem_type != elem)
        return qf_fail(err, QF_ERR_FORMAT, "%s: %s: expected an array of %s", qf_gguf_path(g), key,
                       qf_gguf_type_name(elem));
    *out = v;
    return QF_OK;
}

static void special_id(const qf_gguf *g, const char *key, int32_t n_vocab, int32_t *id) {
    if (*id >= n_vocab) *id = -1; /* a default out of range is disabled */
    int64_t v;
    if (qf_gguf_get_i64(g, key, &v) && v >= 0 && v < n_vocab) *id = (int32_t)v;
}

static qf_status load_tokens(qf_tokenizer *t, const qf_gguf *g, qf_error *err) {
    const char *path = qf_gguf_path(g);
    const qf_gguf_value *toks, *scores, *types;
    qf_status st;
    if ((st = arr_of(g, "tokenizer.ggml.tokens", QF_GGUF_STRING, true, &toks, err))) return st;
    if ((st = arr_of(g, "tokenizer.ggml.token_type", QF_GGUF_INT32, false, &types, err))) return st;
    scores = qf_gguf_find(g, "tokenizer.ggml.scores");
    if (scores && (scores->type != QF_GGUF_ARRAY || (scores->v.arr.elem_type != QF_GGUF_FLOAT32 &&
                                                     scores->v.arr.elem_type != QF_GGUF_INT32)))
        return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.scores: expected an array of float32",
                       path);
    uint64_t n = toks->v.arr.count;
    if (n == 0 || n > (1u << 30))
        return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.tokens: %llu entries, expected 1..2^30",
                       path, (unsigned long long)n);
    if (scores && scores->v.arr.count < n)
        return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.scores: %llu entries, expected %llu",
                       path, (unsigned long long)scores->v.arr.count, (unsigned long long)n);
    if (types && types->v.arr.count < n)
        return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.token_type: %llu entries, expected %llu",
                       path, (unsigned long long)types->v.arr.count, (unsigned long long)n);
    t->n_vocab = (int32_t)n;

    /* first pass: pool size */
    uint64_t pool_size = 0;
    for (uint64_t i = 0; i < n; i++) {
        qf_gguf_value s;
        if (!qf_gguf_array_get(g, toks, i, &s) || s.type != QF_GGUF_STRING)
            return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%llu]: expected a string",
                           path, (unsigned long long)i);
        if (s.v.str.len > (1u << 20))
            return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%llu]: %llu bytes, expected at most 1 MiB",
                           path, (unsigned long long)i, (unsigned long long)s.v.str.len);
        pool_size += (s.v.str.len ? s.v.str.len : 24) + 1;
    }
    if (pool_size > UINT32_MAX)
        return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.tokens: %llu bytes of text, too large",
                       path, (unsigned long long)pool_size);
    t->tok = calloc(n, sizeof *t->tok);
    t->pool = malloc(pool_size);
    uint64_t cap = pow2_at_least(2 * n);
    t->tok_ht = malloc(cap * sizeof *t->tok_ht);
    if (!t->tok || !t->pool || !t->tok_ht) return qf_fail(err, QF_ERR_NOMEM, "tokenizer: out of memory");
    t->tok_mask = cap - 1;
    memset(t->tok_ht, 0xff, cap * sizeof *t->tok_ht);

    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        qf_gguf_value s;
        qf_gguf_array_get(g, toks, i, &s);
        token *tk = &t->tok[i];
        tk->off = off;
        if (s.v.str.len == 0) { /* an empty text would match everywhere in the partition */
            tk->len = (uint32_t)snprintf(t->pool + off, 25, "[EMPTY_%llu]", (unsigned long long)i);
        } else {
            tk->len = (uint32_t)s.v.str.len;
            memcpy(t->pool + off, s.v.str.ptr, tk->len);
            t->pool[off + tk->len] = 0;
        }
        off += tk->len + 1;
        if (scores) {
            const uint8_t *p = scores->v.arr.data + 4 * i;
            if (scores->v.arr.elem_type == QF_GGUF_FLOAT32) {
                memcpy(&tk->score, p, 4);
            } else {
                int32_t v;
                memcpy(&v, p, 4);
                tk->score = (float)v;
            }
        }
        tk->attr = ATTR_NORMAL;
        if (types) {
            int32_t ty;
            memcpy(&ty, types->v.arr.data + 4 * i, 4);
            switch (ty) {
            case 1: tk->attr = ATTR_NORMAL; break;
            case 2: tk->attr = ATTR_UNKNOWN; break;
            case 3: tk->attr = ATTR_CONTROL; break;
            case 4: tk->attr = ATTR_USER_DEFINED; break;
            case 5: tk->attr = ATTR_UNUSED; break;
            case 6: tk->attr = ATTR_BYTE; break;
            default: tk->attr = 0; break;
            }
        }
        /* duplicate texts: the last id wins, as in the llama.cpp that made the test vectors */
        const char *txt = t->pool + tk->off;
        uint64_t h = XXH3_64bits(txt, tk->len) & t->tok_mask;
        for (;; h = (h + 1) & t->tok_mask) {
            int32_t id = t->tok_ht[h];
            if (id < 0 || (t->tok[id].len == tk->len && memcmp(t->pool + t->tok[id].off, txt, tk->len) == 0)) {
                t->tok_ht[h] = (int32_t)i;
                break;
            }
        }
    }
    return QF_OK;
}

static qf_status load_merges(qf_tokenizer *t, const qf_gguf *g, qf_error *err) {
    const char *path = qf_gguf_path(g);
    const qf_gguf_value *mv;
    qf_status st = arr_of(g, "tokenizer.ggml.merges", QF_GGUF_STRING, true, &mv, err);
    if (st) return st;
    uint64_t n = mv->v.arr.count;
    if (n > (1u << 30))
        return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.merges: %llu entries, too many", path,
                       (unsigned long long)n);
    uint64_t pool_size = 0;
    for (uint64_t i = 0; i < n; i++) {
        qf_gguf_value s;
        if (!qf_gguf_array_get(g, mv, i, &s) || s.type != QF_GGUF_STRING)
            return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu]: expected a string",
                           path, (unsigned long long)i);
        pool_size += s.v.str.len;
    }
    if (pool_size > UINT32_MAX)
        return qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.merges: too much text", path);
    uint64_t cap = pow2_at_least(2 * n);
    t->merges = calloc(n ? n : 1, sizeof *t->merges);
    t->mpool = malloc(pool_size ? pool_size : 1);
    t->merge_ht = malloc(cap * sizeof *t->merge_ht);
    if (!t->merges || !t->mpool || !t->merge_ht) return qf_fail(err, QF_ERR_NOMEM, "tokenizer: out of memory");
    t->merge_mask = cap - 1;
    memset(t->merge_ht, 0xff, cap * sizeof *t->merge_ht);
    t->n_merges = (int32_t)n;
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        qf_gguf_value s;
        qf_gguf_array_get(g, mv, i, &s);
        const char *w = s.v.str.ptr;
        uint32_t len = (uint32_t)s.v.str.len;
        memcpy(t->mpool + off, w, len);
        /* split at the first space after the first byte, as llama.cpp: word.find(' ', 1) */
        const char *sp = len > 1 ? memchr(w + 1, ' ', len - 1) : NULL;
        merge *m = &t->merges[i];
        if (sp) {
            uint32_t a = (uint32_t)(sp - w);
            *m = (merge){off, a, off + a + 1, len - a - 1};
        } else {
            *m = (merge){off, 0, off, 0}; /* never matches: symbols are never empty */
        }
        off += len;
        uint64_t h = merge_hash(t->mpool + m->a_off, m->a_len, t->mpool + m->b_off, m->b_len) & t->merge_mask;
        for (;; h = (h + 1) & t->merge_mask) {
            int32_t r = t->merge_ht[h];
            if (r < 0) {
                t->merge_ht[h] = (int32_t)i;
                break;
            }
            const merge *o = &t->merges[r];
            if (o->a_len == m->a_len && o->b_len == m->b_len &&
                memcmp(t->mpool + o->a_off, t->mpool + m->a_off, m->a_len) == 0 &&
                memcmp(t->mpool + o->b_off, t->mpool + m->b_off, m->b_len) == 0)
                break; /* the first (lowest) rank of a duplicate pair wins */
        }
    }
    return QF_OK;
}

static qf_status compile_pre(qf_tokenizer *t, const qf_gguf *g, qf_error *err) {
    const char *name = t->pre[0] ? t->pre : "default";
    const pre_spec *spec = NULL;
    for (size_t i = 0; i < sizeof pre_specs / sizeof pre_specs[0]; i++)
        if (name_in_list(name, pre_specs[i].names)) spec = &pre_specs[i];
    if (!spec)
        return qf_fail(err, QF_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre: unknown pre-tokenizer '%s'",
                       qf_gguf_path(g), name);
    t->add_bos = spec->add_bos;
    t->ignore_merges = spec->ignore_merges;
    for (int i = 0; i < MAX_REGEX && spec->re[i]; i++) {
        const char *re = spec->re[i];
        t->n_re = i + 1;
        if (strcmp(re, RE_GPT2) == 0) {
            t->split[i] = SPLIT_GPT2;
            continue;
        }
        if (strcmp(re, RE_LLAMA3) == 0) {
            t->split[i] = SPLIT_LLAMA3;
            continue;
        }
        t->split[i] = SPLIT_REGEX;
        /* no PCRE2_UCP: \s stays ASCII, as in std::regex, which llama.cpp feeds non-ASCII
         * whitespace as \v; \p{..} still sees Unicode properties. $ means end of subject. */
        int ec;
        PCRE2_SIZE eo;
        t->re[i] = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY,
                                 &ec, &eo, NULL);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return qf_fail(err, QF_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer '%s' regex %d: %s at %zu",
                           name, i, (const char *)msg, (size_t)eo);
        }
        pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE); /* optional speed-up; interpreter otherwise */
    }
    return QF_OK;
}

qf_tokenizer *qf_tokenizer_load(const qf_gguf *g, qf_error *err) {
    const char *path = qf_gguf_path(g);
    qf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        qf_fail(err, QF_ERR_NOMEM, "tokenizer: out of memory");
        return NULL;
    }
    if (!qf_gguf_get_str(g, "tokenizer.ggml.model", t->model, sizeof t->model)) {
        qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.model: missing or not a short string", path);
        goto fail;
    }
    if (!qf_gguf_find(g, "tokenizer.ggml.pre")) t->pre[0] = 0;
    else if (!qf_gguf_get_str(g, "tokenizer.ggml.pre", t->pre, sizeof t->pre)) {
        qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer.ggml.pre: expected a string under 64 bytes", path);
        goto fail;
    }
    if (strcmp(t->model, "llama") == 0) {
        t->type = TYPE_SPM;
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else if (strcmp(t->model, "gpt2") == 0) {
        t->type = TYPE_BPE;
        t->bos = 11, t->eos = 11, t->unk = -1;
    } else {
        qf_fail(err, QF_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model: '%s' is not supported (expected llama or gpt2)",
                path, t->model);
        goto fail;
    }
    if (load_tokens(t, g, err)) goto fail;
    build_byte_maps(t);
    if (t->type == TYPE_BPE) {
        if (load_merges(t, g, err) || compile_pre(t, g, err)) goto fail;
    }
    bool b;
    if (qf_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)) t->add_space_prefix = b;
    if (t->type == TYPE_BPE) t->add_space_prefix = false;
    special_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos);
    special_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos);
    special_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk);
    if (qf_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) t->add_bos = b;

    /* token attributes llama.cpp derives from text rather than from the stored type */
    bool has_fim_key = qf_gguf_find(g, "tokenizer.ggml.fim_pre_token_id") ||
                       qf_gguf_find(g, "tokenizer.ggml.prefix_token_id");
    char name[256] = "";
    qf_gguf_get_str(g, "general.name", name, sizeof name);
    for (char *p = name; *p; p++) *p = (char)tolower((unsigned char)*p);
    bool phi3 = strstr(name, "phi-3") || strstr(name, "phi3");
    bool jina_mask = strstr(t->pre, "jina-v2-de") || strstr(t->pre, "jina-v2-es") || strstr(t->pre, "jina-v2-code");
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t *a = &t->tok[id].attr;
        for (size_t k = 0; k < sizeof control_looking / sizeof control_looking[0]; k++)
            if (tok_is(t, id, control_looking[k])) *a |= ATTR_CONTROL;
        if (!has_fim_key)
            for (size_t k = 0; k < sizeof fim_looking / sizeof fim_looking[0]; k++)
                if (tok_is(t, id, fim_looking[k])) *a |= ATTR_CONTROL;
        if (tok_is(t, id, "<|channel|>") || tok_is(t, id, "<|message|>") || tok_is(t, id, "<|start|>") ||
            tok_is(t, id, "<|constrain|>"))
            *a = ATTR_USER_DEFINED;
        if (jina_mask && tok_is(t, id, "<mask>")) *a |= ATTR_LSTRIP;
    }
    /* special tokens, longest text first (ties by id): the partition tries them in this order */
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->tok[id].attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) t->n_special++;
    uint64_t *keys = malloc((t->n_special ? t->n_special : 1) * sizeof *keys);
    t->special = malloc((t->n_special ? t->n_special : 1) * sizeof *t->special);
    if (!keys || !t->special) {
        free(keys);
        qf_fail(err, QF_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    size_t k = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->tok[id].attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
            keys[k++] = ((uint64_t)(UINT32_MAX - t->tok[id].len) << 32) | (uint32_t)id;
    qsort(keys, t->n_special, sizeof *keys, u64_cmp);
    for (size_t i = 0; i < t->n_special; i++) t->special[i] = (int32_t)(keys[i] & 0xffffffffu);
    free(keys);
    if (phi3) { /* llama.cpp: phi-3 special tokens eat the whitespace after them */
        for (size_t i = 0; i < t->n_special; i++) t->tok[t->special[i]].attr |= ATTR_RSTRIP;
        for (int32_t id = 0; id < t->n_vocab; id++) {
            if (tok_is(t, id, "</s>")) t->tok[id].attr |= ATTR_RSTRIP;
            if (tok_is(t, id, "<unk>") || tok_is(t, id, "<s>") || tok_is(t, id, "<|endoftext|>"))
                t->tok[id].attr &= ~(uint32_t)ATTR_RSTRIP;
        }
    }
    for (int c = 0; c < 256; c++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", c);
        int32_t id = tok_find(t, hex, 6);
        if (id < 0) {
            char one = (char)c;
            id = tok_find(t, &one, 1);
        }
        t->byte_tok[c] = id >= 0 ? id : t->unk;
    }
    return t;
fail:
    qf_tokenizer_free(t);
    return NULL;
}

void qf_tokenizer_free(qf_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < MAX_REGEX; i++)
        if (t->re[i]) pcre2_code_free(t->re[i]);
    free(t->tok);
    free(t->pool);
    free(t->tok_ht);
    free(t->merges);
    free(t->mpool);
    free(t->merge_ht);
    free(t->special);
    free(t);
}

int32_t qf_tokenizer_n_vocab(const qf_tokenizer *t) { return t->n_vocab; }
int32_t qf_tokenizer_bos(const qf_tokenizer *t) { return t->bos; }
int32_t qf_tokenizer_eos(const qf_tokenizer *t) { return t->eos; }
bool qf_tokenizer_add_bos(const qf_tokenizer *t) { return t->add_bos; }
const char *qf_tokenizer_model(const qf_tokenizer *t) { return t->model; }
const char *qf_tokenizer_pre(const qf_tokenizer *t) { return t->pre[0] ? t->pre : "default"; }

/* ---- growable arrays for one tokenize call; a failed allocation sets sess.oom ---- */

typedef struct {
    int prev, next;
    uint32_t off, n;
} symbol;

typedef struct {
    uint32_t key; /* higher merges first: order-preserving SPM score bits, or ~rank for BPE */
    int left, right;
    uint32_t size;
} bigram; /* 16 bytes: the heap of a whole-file SPM fragment is cache-bound */

/* float -> uint32 with the same order (-0 folded into +0, which compare equal as floats) */
static uint32_t score_key(float f) {
    uint32_t u;
    if (f == 0.0f) f = 0.0f;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

typedef struct {
    const qf_tokenizer *t;
    bool oom;
    int32_t *out;
    size_t n_out, cap_out;
    symbol *sym;
    size_t n_sym, cap_sym;
    bigram *heap;
    size_t n_heap, cap_heap;
    uint32_t *cpts;
    size_t cap_cpts;
    size_t *seg, *seg2;
    size_t n_seg, cap_seg, n_seg2, cap_seg2;
    char *buf; /* the text being merged (escaped SPM text, or one byte-encoded BPE word) */
    size_t cap_buf;
    char *rtext; /* the fragment re-encoded for PCRE2 */
    size_t cap_rtext;
    size_t *cpt_off;
    size_t cap_cpt_off;
    pcre2_match_data *md;
} sess;

static bool grow(sess *s, void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) {
        s->oom = true;
        return false;
    }
    *p = q;
    *cap = c;
    return true;
}

static void emit(sess *s, int32_t id) {
    if (!grow(s, (void **)&s->out, &s->cap_out, s->n_out + 1, sizeof *s->out)) return;
    s->out[s->n_out++] = id;
}

static bool bigram_before(const bigram *a, const bigram *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static void heap_push(sess *s, bigram b) {
    if (!grow(s, (void **)&s->heap, &s->cap_heap, s->n_heap + 1, sizeof *s->heap)) return;
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&b, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
}

static bigram heap_pop(sess *s) {
    bigram top = s->heap[0], last = s->heap[--s->n_heap];
    size_t i = 0, n = s->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!bigram_before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Split buf[0, n) into UTF-8 characters as llama.cpp does (by lead byte, cut at the end). */
static void make_symbols(sess *s, size_t n) {
    s->n_sym = 0;
    if (!grow(s, (void **)&s->sym, &s->cap_sym, n, sizeof *s->sym)) return;
    size_t off = 0;
    while (off < n) {
        size_t len = qf_utf8_len((uint8_t)s->buf[off]);
        if (len > n - off) len = n - off;
        int i = (int)s->n_sym++;
        s->sym[i] = (symbol){i - 1, off + len == n ? -1 : i + 1, (uint32_t)off, (uint32_t)len};
        off += len;
    }
}

static void merge_symbols(sess *s, int left) {
    symbol *l = &s->sym[left], *r = &s->sym[l->next];
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) s->sym[r->next].prev = left;
}

/* ---- SentencePiece ---- */

static void spm_try_bigram(sess *s, int left, int right) {
    if (left < 0 || right < 0) return;
    uint32_t size = s->sym[left].n + s->sym[right].n;
    int32_t id = tok_find(s->t, s->buf + s->sym[left].off, size);
    if (id < 0) return;
    heap_push(s, (bigram){score_key(s->t->tok[id].score), left, right, size});
}

/* Merge the best adjacent pair until no pair is left: SPM and BPE share this loop and differ
 * only in how try_pair scores a pair (SPM: the merged token's score; BPE: the merge's rank). */
static void merge_pairs(sess *s, void (*try_pair)(sess *, int, int)) {
    s->n_heap = 0;
    for (size_t i = 1; i < s->n_sym; i++) try_pair(s, (int)i - 1, (int)i);
    while (s->n_heap && !s->oom) {
        bigram b = heap_pop(s);
        symbol *l = &s->sym[b.left], *r = &s->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        merge_symbols(s, b.left);
        try_pair(s, s->sym[b.left].prev, b.left);
        try_pair(s, b.left, s->sym[b.left].next);
    }
}

static void spm_tokenize(sess *s, size_t n) {
    const qf_tokenizer *t = s->t;
    make_symbols(s, n);
    if (s->oom || s->n_sym == 0) return;
    merge_pairs(s, spm_try_bigram);
    /* every merged symbol is a token by construction; what is left unmerged falls back to bytes */
    for (int i = 0; i != -1; i = s->sym[i].next) {
        const symbol *sy = &s->sym[i];
        int32_t id = tok_find(t, s->buf + sy->off, sy->n);
        if (id >= 0) {
            emit(s, id);
            continue;
        }
        for (uint32_t j = 0; j < sy->n; j++) {
            int32_t bid = t->byte_tok[(uint8_t)s->buf[sy->off + j]];
            if (bid >= 0) emit(s, bid);
        }
    }
}

static void spm_fragment(sess *s, const char *text, size_t len, bool prefix_space) {
    size_t need = (len + 1) * 3;
    if (!grow(s, (void **)&s->buf, &s->cap_buf, need, 1)) return;
    size_t n = 0;
    if (prefix_space) {
        memcpy(s->buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            s->buf[n++] = text[i];
        }
    }
    spm_tokenize(s, n);
}

/* ---- byte-level BPE ---- */

static void bpe_try_bigram(sess *s, int left, int right) {
    if (left < 0 || right < 0) return;
    const symbol *l = &s->sym[left], *r = &s->sym[right];
    int32_t rank = merge_rank(s->t, s->buf + l->off, l->n, s->buf + r->off, r->n);
    if (rank < 0) return;
    heap_push(s, (bigram){~(uint32_t)rank, left, right, l->n + r->n});
}

/* One pre-tokenized word, already byte-encoded, in s->buf[0, n). */
static void bpe_word(sess *s, size_t n) {
    const qf_tokenizer *t = s->t;
    if (t->ignore_merges) {
        int32_t id = tok_find(t, s->buf, n);
        if (id >= 0) {
            emit(s, id);
            return;
        }
    }
    make_symbols(s, n);
    if (s->oom || s->n_sym == 0) return;
    merge_pairs(s, bpe_try_bigram);
    for (int i = 0; i != -1; i = s->sym[i].next) {
        const symbol *sy = &s->sym[i];
        int32_t id = tok_find(t, s->buf + sy->off, sy->n);
        if (id >= 0) {
            emit(s, id);
            continue;
        }
        /* llama.cpp's fallback: look each raw byte of the symbol up as a one-byte token */
        for (uint32_t j = 0; j < sy->n; j++) {
            int32_t bid = tok_find(t, s->buf + sy->off + j, 1);
            if (bid >= 0) emit(s, bid);
        }
    }
}

static void seg_push(sess *s, size_t len) {
    if (len == 0) return;
    if (!grow(s, (void **)&s->seg2, &s->cap_seg2, s->n_seg2 + 1, sizeof *s->seg2)) return;
    s->seg2[s->n_seg2++] = len;
}

#define OOR 0xFFFFFFFFu

static inline uint32_t cpt_at(const uint32_t *cp, size_t end, size_t p) { return p < end ? cp[p] : OOR; }
static inline uint16_t flags_at(const uint32_t *cp, size_t end, size_t p) {
    return p < end ? qf_cpt_flags(cp[p]) : 0; /* past the end: no flags at all */
}

/* llama.cpp's unicode_regex_split_custom_gpt2 / _llama3: the same decisions, position by
 * position, over cpts[ini, end). */
static void split_custom(sess *s, int kind, size_t ini, size_t end) {
    const uint32_t *cp = s->cpts;
#define CPT(p) cpt_at(cp, end, (p))
#define FL(p) flags_at(cp, end, (p))
    const uint16_t WS = QF_CPT_WHITESPACE, LET = QF_CPT_LETTER, NUM = QF_CPT_NUMBER;
    size_t prev_end = ini;
#define ADD(e)                        \
    do {                              \
        seg_push(s, (e) - prev_end);  \
        prev_end = (e);               \
    } while (0)
    for (size_t pos = ini; pos < end;) {
        uint32_t c = cp[pos];
        uint16_t fl = FL(pos);
        if (c == '\'' && pos + 1 < end) {
            uint32_t n1 = CPT(pos + 1);
            if (kind == SPLIT_LLAMA3 && n1 < 0x80) n1 = (uint32_t)tolower((int)n1);
            if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
                pos += 2;
                ADD(pos);
                continue;
            }
            if (pos + 2 < end) {
                uint32_t n2 = CPT(pos + 2);
                if (kind == SPLIT_LLAMA3 && n2 < 0x80) n2 = (uint32_t)tolower((int)n2);
                if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
                    pos += 3;
                    ADD(pos);
                    continue;
                }
            }
        }
        if (kind == SPLIT_GPT2) {
            uint16_t f2 = c == ' ' ? FL(pos + 1) : fl;
            if (f2 & LET) { /* ?\p{L}+ */
                pos += c == ' ';
                while (f2 & LET) f2 = FL(++pos);
                ADD(pos);
                continue;
            }
            if (f2 & NUM) { /* ?\p{N}+ */
                pos += c == ' ';
                while (f2 & NUM) f2 = FL(++pos);
                ADD(pos);
                continue;
            }
            if (!(f2 & (WS | LET | NUM)) && f2) { /* ?[^\s\p{L}\p{N}]+ */
                pos += c == ' ';
                while (!(f2 & (WS | LET | NUM)) && f2) f2 = FL(++pos);
                ADD(pos);
                continue;
            }
            size_t nws = 0;
            while (FL(pos + nws) & WS) nws++;
            if (nws > 1 && CPT(pos + nws) != OOR) { /* \s+(?!\S) */
                pos += nws - 1;
                ADD(pos);
                continue;
            }
            if (nws > 0) {
                pos += nws;
                ADD(pos);
                continue;
            }
            ADD(++pos);
            continue;
        }
        /* llama3 */
        if (!(c == '\r' || c == '\n' || (fl & NUM))) { /* [^\r\n\p{L}\p{N}]?\p{L}+ */
            if ((fl & LET) || (FL(pos + 1) & LET)) {
                pos++;
                while (FL(pos) & LET) pos++;
                ADD(pos);
                continue;
            }
        }
        if (fl & NUM) { /* \p{N}{1,3} */
            size_t i0 = pos;
            while (FL(pos) & NUM) {
                if (++pos - i0 >= 3) {
                    ADD(pos);
                    i0 = pos;
                }
            }
            ADD(pos);
            continue;
        }
        uint16_t f2 = c == ' ' ? FL(pos + 1) : fl;
        if (!(f2 & (WS | LET | NUM)) && fl) { /* ?[^\s\p{L}\p{N}]+[\r\n]* (llama.cpp tests fl here) */
            pos += c == ' ';
            while (!(f2 & (WS | LET | NUM)) && f2) f2 = FL(++pos);
            uint32_t c2 = CPT(pos);
            while (c2 == '\r' || c2 == '\n') c2 = CPT(++pos);
            ADD(pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (FL(pos + nws) & WS) {
            uint32_t c2 = CPT(pos + nws);
            if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) { /* \s*[\r\n]+ */
            pos = last_rn;
            ADD(pos);
            continue;
        }
        if (nws > 1 && CPT(pos + nws) != OOR) { /* \s+(?!\S) */
            pos += nws - 1;
            ADD(pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            ADD(pos);
            continue;
        }
        ADD(++pos);
    }
#undef CPT
#undef FL
#undef ADD
}

/* Re-encode cpts[0, n) for PCRE2: valid UTF-8 with non-ASCII whitespace as \v (llama.cpp's
 * trick for std::regex, whose \s is ASCII) and surrogates or out-of-range values as a private-
 * use character (category "other", like llama.cpp's collapsed 0xD0). */
static bool build_rtext(sess *s, size_t n) {
    if (!grow(s, (void **)&s->rtext, &s->cap_rtext, 4 * n + 1, 1)) return false;
    if (!grow(s, (void **)&s->cpt_off, &s->cap_cpt_off, n + 1, sizeof *s->cpt_off)) return false;
    size_t b = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = s->cpts[i];
        s->cpt_off[i] = b;
        if (c > 0x7F && (qf_cpt_flags(c) & QF_CPT_WHITESPACE)) c = 0x0B;
        else if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) c = 0xE000;
        b += (size_t)qf_utf8_encode(c, (uint8_t *)s->rtext + b);
    }
    s->cpt_off[n] = b;
    return true;
}

static size_t count_cpts(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((uint8_t)p[i] & 0xC0) != 0x80;
    return k;
}

/* std::regex_iterator over one segment: matches and the gaps between them both become words. */
static void split_regex(sess *s, const pcre2_code *re, size_t ini, size_t end) {
    const char *subj = s->rtext + s->cpt_off[ini];
    size_t len = s->cpt_off[end] - s->cpt_off[ini];
    size_t pos = 0, last = 0;
    while (pos <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)subj, len, pos, PCRE2_NO_UTF_CHECK, s->md, NULL);
        if (rc < 0) break; /* no match (or a resource limit): the rest stays one word */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step over one character */
            if (ms >= len) break;
            pos = ms + qf_utf8_len((uint8_t)subj[ms]);
            continue;
        }
        if (ms > last) seg_push(s, count_cpts(subj + last, ms - last));
        seg_push(s, count_cpts(subj + ms, me - ms));
        last = pos = me;
    }
    if (last < len) seg_push(s, count_cpts(subj + last, len - last));
}

static void bpe_fragment(sess *s, const char *text, size_t len) {
    const qf_tokenizer *t = s->t;
    if (!grow(s, (void **)&s->cpts, &s->cap_cpts, len + 1, sizeof *s->cpts)) return;
    size_t n = 0, off = 0;
    while (off < len) s->cpts[n++] = qf_utf8_next((const uint8_t *)text, len, &off);
    if (n == 0) return;

    s->n_seg = 0;
    if (!grow(s, (void **)&s->seg, &s->cap_seg, 1, sizeof *s->seg)) return;
    s->seg[s->n_seg++] = n;
    bool have_rtext = false;
    for (int r = 0; r < t->n_re && !s->oom; r++) {
        s->n_seg2 = 0;
        if (t->split[r] == SPLIT_REGEX && !have_rtext) {
            if (!build_rtext(s, n)) return;
            have_rtext = true;
        }
        size_t start = 0;
        for (size_t i = 0; i < s->n_seg; i++) {
            size_t e = start + s->seg[i];
            if (t->split[r] == SPLIT_REGEX) split_regex(s, t->re[r], start, e);
            else split_custom(s, t->split[r], start, e);
            start = e;
        }
        size_t *tmp = s->seg, tcap = s->cap_seg;
        s->seg = s->seg2, s->cap_seg = s->cap_seg2, s->n_seg = s->n_seg2;
        s->seg2 = tmp, s->cap_seg2 = tcap;
    }
    if (s->oom) return;

    size_t start = 0;
    for (size_t i = 0; i < s->n_seg && !s->oom; i++) {
        size_t e = start + s->seg[i];
        if (!grow(s, (void **)&s->buf, &s->cap_buf, (e - start) * 8, 1)) return;
        size_t w = 0;
        for (size_t k = start; k < e; k++) {
            uint8_t u[4];
            int m = qf_utf8_encode(s->cpts[k], u);
            for (int j = 0; j < m; j++) {
                memcpy(s->buf + w, t->b2u[u[j]], t->b2u_len[u[j]]);
                w += t->b2u_len[u[j]];
            }
        }
        bpe_word(s, w);
        start = e;
    }
}

/* ---- the special-token partition (llama.cpp tokenizer_st_partition) ---- */

typedef struct {
    int32_t tok; /* -1: raw text [off, off + len) */
    size_t off, len;
} frag;

typedef struct {
    frag *v;
    size_t n, cap;
} frag_list;

static bool frag_push(frag_list *l, frag f) {
    if (l->n == l->cap) {
        size_t c = l->cap ? 2 * l->cap : 16;
        frag *q = realloc(l->v, c * sizeof *q);
        if (!q) return false;
        l->v = q, l->cap = c;
    }
    l->v[l->n++] = f;
    return true;
}

static bool partition(const qf_tokenizer *t, const char *text, size_t len, bool parse_special,
                      frag_list *out) {
    frag_list cur = {0}, next = {0};
    if (len > 0 && !frag_push(&cur, (frag){-1, 0, len})) return false;
    /* Which bytes and byte pairs occur in the text: a special token whose first byte or first
     * two bytes never occur cannot match, so it is skipped without a search or a copy of the
     * fragment list (vocabularies with thousands of user-defined tokens, deepseek-llm's 2398,
     * otherwise pay n_special passes over the text per call). Skipping changes nothing: the
     * fragments are substrings of the text. */
    uint64_t pair[1024] = {0}, byte1[4] = {0};
    if (t->n_special > 8) {
        for (size_t i = 0; i < len; i++) {
            unsigned b = (uint8_t)text[i];
            byte1[b >> 6] |= 1ull << (b & 63);
            if (i + 1 < len) {
                unsigned pr = b << 8 | (uint8_t)text[i + 1];
                pair[pr >> 6] |= 1ull << (pr & 63);
            }
        }
    }
    for (size_t si = 0; si < t->n_special; si++) {
        int32_t id = t->special[si];
        const token *sp = &t->tok[id];
        if (!parse_special && (sp->attr & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
        const char *st = tok_text(t, id);
        if (t->n_special > 8 && sp->len > 0) {
            unsigned b = (uint8_t)st[0];
            if (!(byte1[b >> 6] >> (b & 63) & 1)) continue;
            if (sp->len > 1) {
                unsigned pr = b << 8 | (uint8_t)st[1];
                if (!(pair[pr >> 6] >> (pr & 63) & 1)) continue;
            }
            if (!memmem(text, len, st, sp->len)) continue;
        }
        next.n = 0;
        for (size_t fi = 0; fi < cur.n; fi++) {
            frag f = cur.v[fi];
            if (f.tok >= 0) {
                if (!frag_push(&next, f)) goto oom;
                continue;
            }
            size_t base = f.off, blen = f.len;
            for (;;) {
                const char *p = memmem(text + base, blen, st, sp->len);
                if (!p) {
                    if (!frag_push(&next, (frag){-1, base, blen})) goto oom;
                    break;
                }
                size_t m = (size_t)(p - text);
                if (m > base) {
                    size_t ll = m - base;
                    if (sp->attr & ATTR_LSTRIP)
                        while (ll > 0 && isspace((unsigned char)text[base + ll - 1])) ll--;
                    if (ll > 0 && !frag_push(&next, (frag){-1, base, ll})) goto oom;
                }
                if (!frag_push(&next, (frag){id, 0, 0})) goto oom;
                size_t ro = m + sp->len, rend = base + blen;
                if (ro >= rend) break;
                if (sp->attr & ATTR_RSTRIP)
                    while (ro < rend && isspace((unsigned char)text[ro])) ro++;
                if (ro >= rend) break;
                base = ro, blen = rend - ro;
            }
        }
        frag_list tmp = cur;
        cur = next, next = tmp;
    }
    free(next.v);
    *out = cur;
    return true;
oom:
    free(cur.v);
    free(next.v);
    return false;
}

static void sess_free(sess *s) {
    free(s->sym);
    free(s->heap);
    free(s->cpts);
    free(s->seg);
    free(s->seg2);
    free(s->buf);
    free(s->rtext);
    free(s->cpt_off);
    if (s->md) pcre2_match_data_free(s->md);
}

qf_status qf_tokenize(const qf_tokenizer *t, const char *text, size_t len, bool add_bos,
                      bool parse_special, int32_t **out, size_t *n_out, qf_error *err) {
    *out = NULL;
    *n_out = 0;
    if (!text && len) return qf_fail(err, QF_ERR_ARG, "tokenize: NULL text with length %zu", len);
    sess s = {.t = t};
    frag_list frags = {0};
    if (!partition(t, text, len, parse_special, &frags)) {
        sess_free(&s);
        return qf_fail(err, QF_ERR_NOMEM, "tokenize: out of memory");
    }
    for (int r = 0; r < t->n_re && !s.md; r++)
        if (t->re[r]) s.md = pcre2_match_data_create(4, NULL);
    if (add_bos && t->bos >= 0) emit(&s, t->bos);
    bool prev_special = true; /* SPM: a dummy space before the text and after each special token */
    for (size_t i = 0; i < frags.n && !s.oom; i++) {
        const frag *f = &frags.v[i];
        if (f->tok >= 0) {
            emit(&s, f->tok);
            prev_special = true;
            continue;
        }
        if (t->type == TYPE_SPM) spm_fragment(&s, text + f->off, f->len, t->add_space_prefix && prev_special);
        else bpe_fragment(&s, text + f->off, f->len);
        prev_special = false;
    }
    free(frags.v);
    sess_free(&s);
    if (s.oom) {
        free(s.out);
        return qf_fail(err, QF_ERR_NOMEM, "tokenize: out of memory (%zu bytes of text)", len);
    }
    *out = s.out;
    *n_out = s.n_out;
    return QF_OK;
}

/* ---- detokenize ---- */

static int copy_out(char *buf, size_t cap, const char *src, size_t n) {
    if (buf && cap) memcpy(buf, src, n < cap ? n : cap);
    return (int)n;
}

int qf_token_to_piece(const qf_tokenizer *t, int32_t id, bool special, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return -1;
    const token *tk = &t->tok[id];
    const char *txt = tok_text(t, id);
    if (!special && (tk->attr & (ATTR_UNKNOWN | ATTR_CONTROL))) return 0;
    if (tk->attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) return copy_out(buf, cap, txt, tk->len);
    if (tk->attr & ATTR_BYTE) {
        /* "<0xNN>" */
        char hex[3] = {0};
        if (tk->len >= 5) memcpy(hex, txt + 3, 2);
        char b = (char)strtol(hex, NULL, 16);
        return copy_out(buf, cap, &b, 1);
    }
    if (!(tk->attr & ATTR_NORMAL)) return 0;
    size_t n = 0;
    if (t->type == TYPE_SPM) {
        for (size_t i = 0; i < tk->len;) {
            char c = ' ';
            size_t step = 1;
            if (i + 3 <= tk->len && memcmp(txt + i, "\xe2\x96\x81", 3) == 0) step = 3;
            else c = txt[i];
            if (buf && n < cap) buf[n] = c;
            n++;
            i += step;
        }
        return (int)n;
    }
    /* byte-level: each codepoint of the token text stands for one byte */
    size_t off = 0;
    while (off < tk->len) {
        size_t start = off;
        uint32_t c = qf_utf8_next((const uint8_t *)txt, tk->len, &off);
        if (c < 0x144 && t->u2b[c] >= 0) {
            if (buf && n < cap) buf[n] = (char)t->u2b[c];
            n++;
            continue;
        }
        /* llama.cpp writes "[UNK_BYTE_0x<hex of the char>" + the token text + "]" */
        char tmp[64];
        int k = snprintf(tmp, sizeof tmp, "[UNK_BYTE_0x");
        for (size_t j = start; j < off && k < 56; j++) k += snprintf(tmp + k, sizeof tmp - (size_t)k, "%02x", (uint8_t)txt[j]);
        for (int j = 0; j < k; j++, n++)
            if (buf && n < cap) buf[n] = tmp[j];
        for (size_t j = 0; j < tk->len; j++, n++)
            if (buf && n < cap) buf[n] = txt[j];
        if (buf && n < cap) buf[n] = ']';
        n++;
    }
    return (int)n;
}
