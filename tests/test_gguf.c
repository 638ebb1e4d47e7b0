/* test_gguf.c: the GGUF reader on every real file, on every truncation of a small model and
 * on hand-built hostile headers; the writer's round trip (KV, tensors, whole-file bytes). */
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qforge/gguf.h"
#include "test.h"
#include "util/util.h"

/* ---- helpers ---- */

static bool has(const char *msg, const char *needle) { return strstr(msg, needle) != NULL; }

static int for_each_gguf(const char *subdir, void (*fn)(const char *path)) {
    const char *dir = test_data(subdir);
    if (!dir) return -1;
    char dcopy[4096];
    snprintf(dcopy, sizeof dcopy, "%s", dir);
    DIR *d = opendir(dcopy);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    char names[64][256];
    while ((e = readdir(d)) && n < 64) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0)
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    for (int i = 0; i < n; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dcopy, names[i]);
        fn(path);
    }
    return n;
}

/* ---- real files ---- */

static void open_one(const char *path) {
    qf_error err = {0};
    qf_gguf *g = qf_gguf_open(path, &err);
    CHECK_MSG(g != NULL, "%s: %s", path, err.msg);
    if (!g) return;
    CHECK_EQ_INT(qf_gguf_version(g), 3);
    CHECK(qf_gguf_find(g, "general.architecture") != NULL);
    /* Walk everything: every KV, every array element, every tensor. */
    for (uint64_t i = 0; i < qf_gguf_n_kv(g); i++) {
        const qf_gguf_kv *kv = qf_gguf_kv_at(g, i);
        char key[512];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        CHECK(qf_gguf_find(g, key) == &kv->value);
        if (kv->value.type == QF_GGUF_ARRAY) {
            qf_gguf_value e;
            for (uint64_t j = 0; j < kv->value.v.arr.count; j++)
                if (!qf_gguf_array_get(g, &kv->value, j, &e)) {
                    CHECK_MSG(0, "%s: %s[%llu]", path, key, (unsigned long long)j);
                    break;
                }
            CHECK(!qf_gguf_array_get(g, &kv->value, kv->value.v.arr.count, &e));
        }
    }
    size_t size;
    qf_gguf_file_data(g, &size);
    for (uint64_t i = 0; i < qf_gguf_n_tensors(g); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(g, i);
        char name[512];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        CHECK(qf_gguf_find_tensor(g, name) == t);
        CHECK(t->nbytes == qf_row_bytes(t->type, t->ne[0]) * (uint64_t)(qf_gguf_tensor_nelements(t) / t->ne[0]));
        CHECK(qf_gguf_data_offset(g) + t->offset + t->nbytes <= size);
    }
    qf_gguf_close(g);
}

TEST(open_every_model) {
    int n = for_each_gguf("models", open_one);
    if (n < 0) SKIP("../shared/data/models not found");
    CHECK(n >= 1);
}

TEST(open_every_vocab) {
    int n = for_each_gguf("vocab", open_one);
    if (n < 0) SKIP("../shared/data/vocab not found");
    CHECK(n >= 1);
}

TEST(lookup_stories260k) {
    const char *path = test_data("models/stories260K.gguf");
    if (!path) SKIP("models/stories260K.gguf not found");
    qf_error err;
    qf_gguf *g = qf_gguf_open(path, &err);
    CHECK_MSG(g, "%s", err.msg);
    if (!g) return;
    char arch[32];
    CHECK(qf_gguf_get_str(g, "general.architecture", arch, sizeof arch));
    CHECK(strcmp(arch, "llama") == 0);
    CHECK(!qf_gguf_get_str(g, "general.architecture", arch, 5)); /* truncated: refused */
    uint32_t n_embd = 0;
    CHECK(qf_gguf_get_u32(g, "llama.embedding_length", &n_embd));
    CHECK_EQ_INT(n_embd, 64);
    int64_t i64;
    CHECK(qf_gguf_get_i64(g, "llama.embedding_length", &i64) && i64 == 64);
    float eps = 0;
    CHECK(qf_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps));
    CHECK(eps > 0 && eps < 1e-3f);
    bool b;
    CHECK(!qf_gguf_get_bool(g, "llama.embedding_length", &b));
    CHECK(!qf_gguf_get_u32(g, "general.architecture", &n_embd));
    CHECK(qf_gguf_find(g, "no.such.key") == NULL);
    const qf_gguf_value *tok = qf_gguf_find(g, "tokenizer.ggml.tokens");
    CHECK(tok && tok->type == QF_GGUF_ARRAY && tok->v.arr.elem_type == QF_GGUF_STRING);
    if (tok) {
        CHECK_EQ_INT(tok->v.arr.count, 512);
        qf_gguf_value e;
        CHECK(qf_gguf_array_get(g, tok, 0, &e) && e.type == QF_GGUF_STRING);
        CHECK(e.v.str.len == 5 && memcmp(e.v.str.ptr, "<unk>", 5) == 0);
    }
    const qf_gguf_tensor *t = qf_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t != NULL);
    if (t) {
        CHECK_EQ_INT(t->ne[0], 64);
        CHECK_EQ_INT(t->ne[1], 512);
    }
    CHECK(qf_gguf_find_tensor(g, "nope") == NULL);
    CHECK(qf_gguf_tensor_at(g, qf_gguf_n_tensors(g)) == NULL);
    CHECK(qf_gguf_kv_at(g, qf_gguf_n_kv(g)) == NULL);
    qf_gguf_close(g);
}

TEST(missing_file) {
    qf_error err = {0};
    CHECK(qf_gguf_open("/nonexistent/x.gguf", &err) == NULL);
    CHECK(err.code == QF_ERR_IO && has(err.msg, "/nonexistent/x.gguf"));
}

/* ---- truncations ---- */

static int try_prefix(const uint8_t *file, size_t len) {
    /* An exact-size copy so ASan sees any read past the end. */
    uint8_t *buf = malloc(len ? len : 1);
    memcpy(buf, file, len);
    qf_error err = {0};
    qf_gguf *g = qf_gguf_open_buffer(buf, len, "stories260K.gguf", &err);
    int bad = 0;
    if (g) {
        qf_gguf_close(g);
        bad = 1;
    } else if (err.code != QF_ERR_FORMAT || !has(err.msg, "stories260K.gguf")) {
        fprintf(stderr, "  len %zu: unexpected error %d '%s'\n", len, err.code, err.msg);
        bad = 1;
    }
    free(buf);
    return bad;
}

TEST(every_truncation) {
    const char *path = test_data("models/stories260K.gguf");
    if (!path) SKIP("models/stories260K.gguf not found");
    qf_mapped_file mf;
    qf_error err;
    CHECK(qf_map_file(path, &mf, &err) == QF_OK);
    qf_gguf *g = qf_gguf_open_buffer(mf.data, mf.size, "stories260K.gguf", &err);
    CHECK(g != NULL);
    if (!g) return;
    size_t header = qf_gguf_data_offset(g);
    /* The last tensor ends at the end of the file; cutting anywhere in the data region must
     * fail unless the cut is past every tensor's end. */
    uint64_t data_end = 0;
    for (uint64_t i = 0; i < qf_gguf_n_tensors(g); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(g, i);
        if (t->offset + t->nbytes > data_end) data_end = t->offset + t->nbytes;
    }
    qf_gguf_close(g);
    int failures = 0;
    for (size_t len = 0; len <= header; len++) failures += try_prefix(mf.data, len);
    /* The data region: 256 evenly spaced cuts plus the last few bytes. */
    size_t end = header + data_end;
    for (int k = 0; k < 256; k++) failures += try_prefix(mf.data, header + (end - header) * k / 256 + 1);
    for (size_t len = end - 4; len < end; len++) failures += try_prefix(mf.data, len);
    CHECK_EQ_INT(failures, 0);
    qf_unmap_file(&mf);
}

/* ---- hand-built hostile headers ---- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
} buf;

static void put(buf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 256;
        o->b = realloc(o->b, o->cap);
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void put_u32(buf *o, uint32_t v) { put(o, &v, 4); }
static void put_u64(buf *o, uint64_t v) { put(o, &v, 8); }
static void put_str(buf *o, const char *s) {
    put_u64(o, strlen(s));
    put(o, s, strlen(s));
}
static void put_pad(buf *o, size_t align) {
    while (o->n % align) put(o, "", 1);
}

/* A small valid file; each field can be overridden to make it hostile. */
typedef struct {
    const char *magic;
    uint32_t version;
    uint64_t n_kv, n_tensors; /* 0 = the real count */
    uint64_t key_len;         /* 0 = the real length of the first key */
    bool no_alignment_kv;
    uint32_t alignment_type;
    uint32_t alignment;
    bool dup_key;
    uint32_t n_dims;
    int64_t ne[5];
    uint32_t type;
    uint64_t offset;
    const char *second_name; /* NULL = one tensor only */
    uint64_t second_offset;
    size_t data_bytes; /* 0 = enough for the tensors */
} spec;

static spec base_spec(void) {
    spec s = {.magic = "GGUF", .version = 3, .alignment_type = QF_GGUF_UINT32, .alignment = 32,
              .n_dims = 2, .ne = {32, 2, 1, 1, 1}, .type = QF_TYPE_F32};
    return s;
}

static buf build(const spec *s) {
    buf o = {0};
    put(&o, s->magic, 4);
    put_u32(&o, s->version);
    uint64_t nt = s->second_name ? 2 : 1;
    uint64_t nkv = 1 + !s->no_alignment_kv + s->dup_key;
    put_u64(&o, s->n_tensors ? s->n_tensors : nt);
    put_u64(&o, s->n_kv ? s->n_kv : nkv);
    put_u64(&o, s->key_len ? s->key_len : strlen("general.architecture"));
    put(&o, "general.architecture", strlen("general.architecture"));
    put_u32(&o, QF_GGUF_STRING);
    put_str(&o, "llama");
    if (!s->no_alignment_kv) {
        put_str(&o, "general.alignment");
        put_u32(&o, s->alignment_type);
        put_u32(&o, s->alignment);
    }
    if (s->dup_key) {
        put_str(&o, "general.architecture");
        put_u32(&o, QF_GGUF_STRING);
        put_str(&o, "qwen2");
    }
    put_str(&o, "w");
    put_u32(&o, s->n_dims);
    for (uint32_t d = 0; d < s->n_dims && d < 5; d++) put_u64(&o, (uint64_t)s->ne[d]);
    put_u32(&o, s->type);
    put_u64(&o, s->offset);
    if (s->second_name) {
        put_str(&o, s->second_name);
        put_u32(&o, 1);
        put_u64(&o, 32);
        put_u32(&o, QF_TYPE_F32);
        put_u64(&o, s->second_offset);
    }
    put_pad(&o, s->alignment && !(s->alignment & (s->alignment - 1)) && s->alignment <= 4096
                    ? s->alignment : 32);
    size_t data = s->data_bytes ? s->data_bytes : 256 + (s->second_name ? 128 : 0);
    for (size_t i = 0; i < data; i++) put(&o, "\x01", 1);
    return o;
}

/* Open the built file and expect failure with all the given substrings in the message. */
static void expect_fail(const spec *s, const char *want1, const char *want2) {
    buf o = build(s);
    qf_error err = {0};
    qf_gguf *g = qf_gguf_open_buffer(o.b, o.n, "evil.gguf", &err);
    CHECK_MSG(g == NULL, "expected failure mentioning '%s'", want1);
    if (g) qf_gguf_close(g);
    else {
        CHECK_MSG(err.code == QF_ERR_FORMAT, "code %d: %s", err.code, err.msg);
        CHECK_MSG(has(err.msg, "evil.gguf"), "%s", err.msg);
        CHECK_MSG(has(err.msg, want1), "want '%s' in: %s", want1, err.msg);
        if (want2) CHECK_MSG(has(err.msg, want2), "want '%s' in: %s", want2, err.msg);
    }
    free(o.b);
}

TEST(hostile_base_is_valid) {
    spec s = base_spec();
    buf o = build(&s);
    qf_error err = {0};
    qf_gguf *g = qf_gguf_open_buffer(o.b, o.n, "ok.gguf", &err);
    CHECK_MSG(g, "%s", err.msg);
    if (g) {
        CHECK_EQ_INT(qf_gguf_n_tensors(g), 1);
        CHECK_EQ_INT(qf_gguf_tensor_at(g, 0)->nbytes, 256);
        qf_gguf_close(g);
    }
    free(o.b);
}

TEST(hostile_headers) {
    spec s;
    s = base_spec(); s.magic = "GGML"; expect_fail(&s, "magic", "GGUF");
    s = base_spec(); s.version = 1; expect_fail(&s, "version", "v1");
    s = base_spec(); s.version = 4; expect_fail(&s, "version", "4");
    s = base_spec(); s.version = 0x03000000; expect_fail(&s, "version", "big-endian");
    s = base_spec(); s.n_kv = 1ull << 60; expect_fail(&s, "metadata kv count", NULL);
    s = base_spec(); s.n_tensors = UINT64_MAX; expect_fail(&s, "tensor count", NULL);
    s = base_spec(); s.key_len = 1ull << 62; expect_fail(&s, "kv 0", "string length");
    s = base_spec(); s.alignment = 3; expect_fail(&s, "general.alignment", "power of two");
    s = base_spec(); s.alignment = 0; expect_fail(&s, "general.alignment", "power of two");
    s = base_spec(); s.alignment_type = QF_GGUF_FLOAT32; expect_fail(&s, "general.alignment", "uint32");
    s = base_spec(); s.alignment_type = 77; expect_fail(&s, "kv 1 'general.alignment'", "value type 77");
    s = base_spec(); s.dup_key = true; expect_fail(&s, "kv 2 'general.architecture'", "duplicate key");
    s = base_spec(); s.n_dims = 5; expect_fail(&s, "tensor 0 'w'", "n_dims");
    s = base_spec(); s.n_dims = 0; expect_fail(&s, "tensor 0 'w'", "n_dims");
    /* issue 14: fuzz_gguf found a zero-byte tensor accepted by the reader (its harness then read
     * d[nbytes - 1]); every dimension must be positive, so no valid tensor is empty */
    s = base_spec(); s.ne[0] = 0; expect_fail(&s, "tensor 0 'w'", "ne[0] = 0");
    s = base_spec(); s.ne[1] = 0; expect_fail(&s, "tensor 0 'w'", "ne[1] = 0");
    s = base_spec(); s.ne[0] = -32; expect_fail(&s, "tensor 0 'w'", "ne[0] = -32");
    s = base_spec(); s.ne[0] = 1ll << 40; s.ne[1] = 1ll << 40; expect_fail(&s, "tensor 0 'w'", "overflow");
    s = base_spec(); s.n_dims = 4; s.ne[0] = 1ll << 20; s.ne[1] = 1ll << 20; s.ne[2] = 1ll << 20;
    s.ne[3] = 1ll << 3; expect_fail(&s, "tensor 0 'w'", "overflow");
    s = base_spec(); s.type = 99; expect_fail(&s, "tensor 0 'w'", "type: 99");
    s = base_spec(); s.type = 4; expect_fail(&s, "tensor 0 'w'", "type: 4"); /* removed Q4_2 */
    s = base_spec(); s.type = QF_TYPE_Q8_0; s.ne[0] = 48; expect_fail(&s, "tensor 0 'w'", "block size");
    s = base_spec(); s.offset = 1ull << 40; expect_fail(&s, "tensor 0 'w'", "past end of file");
    s = base_spec(); s.offset = UINT64_MAX - 31; expect_fail(&s, "tensor 0 'w'", "past end of file");
    s = base_spec(); s.offset = 4; expect_fail(&s, "tensor 0 'w'", "alignment");
    s = base_spec(); s.data_bytes = 100; expect_fail(&s, "tensor 0 'w'", "past end of file");
    s = base_spec(); s.second_name = "w"; s.second_offset = 256; expect_fail(&s, "tensor 1 'w'", "duplicate tensor");
    s = base_spec(); s.second_name = "v"; s.second_offset = 224; expect_fail(&s, "overlaps", "'w'");
}

/* Arrays: nested arrays decode; hostile counts and depths are refused. */
static buf kv_file(void (*emit_value)(buf *o)) {
    buf o = {0};
    put(&o, "GGUF", 4);
    put_u32(&o, 2); /* v2 is accepted too */
    put_u64(&o, 0);
    put_u64(&o, 1);
    put_str(&o, "test.arr");
    emit_value(&o);
    return o;
}

static void emit_nested(buf *o) {
    put_u32(o, QF_GGUF_ARRAY);
    put_u32(o, QF_GGUF_ARRAY); /* [[ "a", "bc" ], [], [1.5f]] */
    put_u64(o, 3);
    put_u32(o, QF_GGUF_STRING);
    put_u64(o, 2);
    put_str(o, "a");
    put_str(o, "bc");
    put_u32(o, QF_GGUF_INT8);
    put_u64(o, 0);
    put_u32(o, QF_GGUF_FLOAT32);
    put_u64(o, 1);
    float f = 1.5f;
    put(o, &f, 4);
}
static void emit_u64_overflow(buf *o) {
    put_u32(o, QF_GGUF_ARRAY);
    put_u32(o, QF_GGUF_UINT64);
    put_u64(o, 1ull << 61); /* * 8 bytes overflows */
}
static void emit_many_strings(buf *o) {
    put_u32(o, QF_GGUF_ARRAY);
    put_u32(o, QF_GGUF_STRING);
    put_u64(o, 1ull << 40);
}
static void emit_deep(buf *o) {
    put_u32(o, QF_GGUF_ARRAY);
    for (int i = 0; i < 100; i++) {
        put_u32(o, QF_GGUF_ARRAY);
        put_u64(o, 1);
    }
    put_u32(o, QF_GGUF_UINT8);
    put_u64(o, 0);
}
static void emit_bad_elem_type(buf *o) {
    put_u32(o, QF_GGUF_ARRAY);
    put_u32(o, 13);
    put_u64(o, 1);
}

TEST(arrays) {
    buf o = kv_file(emit_nested);
    qf_error err = {0};
    qf_gguf *g = qf_gguf_open_buffer(o.b, o.n, "nested.gguf", &err);
    CHECK_MSG(g, "%s", err.msg);
    if (g) {
        CHECK_EQ_INT(qf_gguf_version(g), 2);
        const qf_gguf_value *v = qf_gguf_find(g, "test.arr");
        qf_gguf_value a, e;
        CHECK(v && v->v.arr.count == 3 && v->v.arr.elem_type == QF_GGUF_ARRAY);
        CHECK(qf_gguf_array_get(g, v, 0, &a) && a.v.arr.count == 2);
        CHECK(qf_gguf_array_get(g, &a, 1, &e) && e.v.str.len == 2 && !memcmp(e.v.str.ptr, "bc", 2));
        CHECK(!qf_gguf_array_get(g, &a, 2, &e));
        CHECK(qf_gguf_array_get(g, v, 1, &a) && a.v.arr.count == 0 && a.v.arr.nbytes == 0);
        CHECK(qf_gguf_array_get(g, v, 2, &a) && a.v.arr.elem_type == QF_GGUF_FLOAT32);
        CHECK(qf_gguf_array_get(g, &a, 0, &e) && e.v.f64 == 1.5);
        CHECK(!qf_gguf_array_get(g, v, 3, &a));
        qf_gguf_close(g);
    }
    free(o.b);
    struct { void (*emit)(buf *); const char *want; } bad[] = {
        {emit_u64_overflow, "past end of file"},
        {emit_many_strings, "cannot fit"},
        {emit_deep, "nested deeper"},
        {emit_bad_elem_type, "element type 13"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = kv_file(bad[i].emit);
        g = qf_gguf_open_buffer(o.b, o.n, "arr.gguf", &err);
        CHECK(g == NULL);
        if (g) qf_gguf_close(g);
        else CHECK_MSG(has(err.msg, "arr.gguf: kv 0 'test.arr'") && has(err.msg, bad[i].want),
                       "%s", err.msg);
        free(o.b);
    }
}

/* ---- writer ---- */

static bool same_value(const qf_gguf *a, const qf_gguf_value *x, const qf_gguf *b,
                       const qf_gguf_value *y) {
    if (x->type != y->type) return false;
    switch (x->type) {
    case QF_GGUF_STRING:
        return x->v.str.len == y->v.str.len && !memcmp(x->v.str.ptr, y->v.str.ptr, x->v.str.len);
    case QF_GGUF_ARRAY:
        return x->v.arr.elem_type == y->v.arr.elem_type && x->v.arr.count == y->v.arr.count &&
               x->v.arr.nbytes == y->v.arr.nbytes &&
               !memcmp(x->v.arr.data, y->v.arr.data, x->v.arr.nbytes);
    default:
        return !memcmp(&x->v, &y->v, sizeof x->v);
    }
}

static int n_identical, n_roundtrips;

static void roundtrip_one(const char *path) {
    qf_error err = {0};
    qf_gguf *src = qf_gguf_open(path, &err);
    CHECK_MSG(src, "%s", err.msg);
    if (!src) return;
    qf_gguf_writer *w = qf_gguf_writer_new();
    CHECK(qf_gguf_writer_copy_kv(w, src, NULL, &err) == QF_OK);
    for (uint64_t i = 0; i < qf_gguf_n_tensors(src); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(src, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        CHECK(qf_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes,
                                        &err) == QF_OK);
    }
    char out[4096];
    snprintf(out, sizeof out, "%s/rt.gguf", test_tmpdir());
    CHECK_MSG(qf_gguf_writer_write(w, out, &err) == QF_OK, "%s", err.msg);
    qf_gguf_writer_free(w);
    qf_gguf *dst = qf_gguf_open(out, &err);
    CHECK_MSG(dst, "%s", err.msg);
    if (dst) {
        CHECK_EQ_INT(qf_gguf_n_kv(dst), qf_gguf_n_kv(src));
        CHECK_EQ_INT(qf_gguf_n_tensors(dst), qf_gguf_n_tensors(src));
        for (uint64_t i = 0; i < qf_gguf_n_kv(src) && i < qf_gguf_n_kv(dst); i++) {
            const qf_gguf_kv *a = qf_gguf_kv_at(src, i), *b = qf_gguf_kv_at(dst, i);
            CHECK(a->key.len == b->key.len && !memcmp(a->key.ptr, b->key.ptr, a->key.len));
            CHECK(same_value(src, &a->value, dst, &b->value));
        }
        for (uint64_t i = 0; i < qf_gguf_n_tensors(src) && i < qf_gguf_n_tensors(dst); i++) {
            const qf_gguf_tensor *a = qf_gguf_tensor_at(src, i), *b = qf_gguf_tensor_at(dst, i);
            CHECK(a->name.len == b->name.len && !memcmp(a->name.ptr, b->name.ptr, a->name.len));
            CHECK(a->type == b->type && a->n_dims == b->n_dims && a->nbytes == b->nbytes);
            CHECK(!memcmp(a->ne, b->ne, sizeof a->ne));
            CHECK(!memcmp(a->data, b->data, a->nbytes));
        }
        size_t na, nb;
        const uint8_t *da = qf_gguf_file_data(src, &na), *db = qf_gguf_file_data(dst, &nb);
        bool same = na == nb && !memcmp(da, db, na);
        printf("  %s: written file %s the source (%zu vs %zu bytes)\n", strrchr(path, '/') + 1,
               same ? "is byte-identical to" : "DIFFERS from", na, nb);
        n_identical += same;
        n_roundtrips++;
        qf_gguf_close(dst);
    }
    unlink(out);
    qf_gguf_close(src);
}

TEST(writer_roundtrip_models) {
    n_identical = n_roundtrips = 0;
    int n = for_each_gguf("models", roundtrip_one);
    if (n < 0) SKIP("../shared/data/models not found");
    /* All of these were written by llama.cpp / gguf-py in file order with 32-byte padding. */
    CHECK_EQ_INT(n_identical, n_roundtrips);
}

TEST(writer_roundtrip_vocab) {
    const char *path = test_data("vocab/ggml-vocab-llama-spm.gguf");
    if (!path) SKIP("vocab/ggml-vocab-llama-spm.gguf not found");
    n_identical = n_roundtrips = 0;
    roundtrip_one(path);
    CHECK_EQ_INT(n_identical, 1);
}

TEST(writer_api) {
    qf_gguf_writer *w = qf_gguf_writer_new();
    qf_error err = {0};
    CHECK(qf_gguf_writer_set_str(w, "general.architecture", "llama") == QF_OK);
    CHECK(qf_gguf_writer_set_u32(w, "general.alignment", 64) == QF_OK);
    CHECK(qf_gguf_writer_set_f32(w, "x.eps", 1e-5f) == QF_OK);
    CHECK(qf_gguf_writer_set_bool(w, "x.flag", true) == QF_OK);
    CHECK(qf_gguf_writer_set_u32(w, "x.n", 1) == QF_OK);
    CHECK(qf_gguf_writer_set_u32(w, "x.n", 7) == QF_OK); /* replaced in place */
    buf o = kv_file(emit_nested);
    qf_gguf *nested = qf_gguf_open_buffer(o.b, o.n, "nested.gguf", &err);
    CHECK(nested);
    if (nested) CHECK(qf_gguf_writer_set_value(w, "x.nested", nested, qf_gguf_find(nested, "test.arr")) == QF_OK);
    float data[64 * 3];
    for (int i = 0; i < 64 * 3; i++) data[i] = (float)i;
    int64_t ne[2] = {64, 3};
    CHECK(qf_gguf_writer_add_tensor(w, "a", QF_TYPE_F32, 2, ne, data, sizeof data, &err) == QF_OK);
    CHECK(qf_gguf_writer_add_tensor(w, "b", QF_TYPE_F32, 1, ne, data, 256, &err) == QF_OK);
    CHECK(qf_gguf_writer_add_tensor(w, "a", QF_TYPE_F32, 1, ne, data, 256, &err) == QF_ERR_ARG);
    CHECK(qf_gguf_writer_add_tensor(w, "c", QF_TYPE_F32, 1, ne, data, 255, &err) == QF_ERR_ARG);
    CHECK(qf_gguf_writer_add_tensor(w, "c", QF_TYPE_Q8_0, 1, (int64_t[]){48}, data, 51, &err) == QF_ERR_ARG);
    CHECK(qf_gguf_writer_add_tensor(w, "c", (qf_type)99, 1, ne, data, 256, &err) == QF_ERR_ARG);
    CHECK(qf_gguf_writer_add_tensor(w, "c", QF_TYPE_F32, 5, ne, data, 256, &err) == QF_ERR_ARG);
    char out[4096];
    snprintf(out, sizeof out, "%s/api.gguf", test_tmpdir());
    CHECK_MSG(qf_gguf_writer_write(w, out, &err) == QF_OK, "%s", err.msg);
    qf_gguf *g = qf_gguf_open(out, &err);
    CHECK_MSG(g, "%s", err.msg);
    if (g) {
        uint32_t n = 0;
        float eps = 0;
        bool flag = false;
        CHECK(qf_gguf_get_u32(g, "x.n", &n) && n == 7);
        CHECK_EQ_INT(qf_gguf_n_kv(g), 6);
        CHECK(qf_gguf_kv_at(g, 4)->key.len == 3); /* x.n kept its first position */
        CHECK(qf_gguf_get_f32(g, "x.eps", &eps) && eps == 1e-5f);
        CHECK(qf_gguf_get_bool(g, "x.flag", &flag) && flag);
        CHECK_EQ_INT(qf_gguf_alignment(g), 64);
        CHECK_EQ_INT(qf_gguf_data_offset(g) % 64, 0);
        const qf_gguf_tensor *b = qf_gguf_find_tensor(g, "b");
        CHECK(b && b->offset == 768 && !memcmp(b->data, data, 256));
        const qf_gguf_value *v = qf_gguf_find(g, "x.nested");
        qf_gguf_value a, e;
        CHECK(v && qf_gguf_array_get(g, v, 0, &a) && qf_gguf_array_get(g, &a, 0, &e) &&
              e.v.str.len == 1 && e.v.str.ptr[0] == 'a');
        size_t size;
        qf_gguf_file_data(g, &size);
        CHECK_EQ_INT(size % 64, 0);
        qf_gguf_close(g);
    }
    /* A bad alignment is refused and leaves no file behind. */
    CHECK(qf_gguf_writer_set_u32(w, "general.alignment", 48) == QF_OK);
    char out2[4096];
    snprintf(out2, sizeof out2, "%s/bad.gguf", test_tmpdir());
    CHECK(qf_gguf_writer_write(w, out2, &err) == QF_ERR_ARG);
    CHECK(access(out2, F_OK) != 0);
    unlink(out);
    qf_gguf_writer_free(w);
    if (nested) qf_gguf_close(nested);
    free(o.b);
}

/* ---- qforge info, end to end ---- */

static char *run_cmd(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t got;
    while ((got = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 == cap) out = realloc(out, cap *= 2);
    }
    out[n] = 0;
    *status = pclose(p);
    return out;
}

TEST(cli_info) {
    const char *path = test_data("models/stories260K.gguf");
    if (!path) SKIP("models/stories260K.gguf not found");
    if (access(test_cli(), X_OK) != 0) SKIP("qforge CLI not built");
    char model[4096], cmd[8192];
    snprintf(model, sizeof model, "%s", path);
    snprintf(cmd, sizeof cmd, "'%s' info '%s' --json", test_cli(), model);
    int st;
    char *out = run_cmd(cmd, &st);
    CHECK(out && st == 0);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECK_MSG(j, "info --json is not JSON: %s", je.text);
    if (j) {
        CHECK_EQ_INT(json_integer_value(json_object_get(j, "version")), 3);
        CHECK_EQ_INT(json_integer_value(json_object_get(j, "data_offset")), 14176);
        CHECK_EQ_INT(json_array_size(json_object_get(j, "tensors")), 48);
        json_t *tok = json_object_get(json_object_get(json_object_get(j, "metadata"),
                                                      "tokenizer.ggml.tokens"), "value");
        CHECK_EQ_INT(json_integer_value(json_object_get(tok, "count")), 512);
        CHECK_EQ_INT(json_array_size(json_object_get(tok, "head")), 8);
        json_t *tot = json_object_get(j, "totals");
        CHECK_EQ_INT(json_integer_value(json_object_get(tot, "params")), 292800);
        json_decref(j);
    }
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' info '%s'", test_cli(), model);
    out = run_cmd(cmd, &st);
    CHECK(out && st == 0 && has(out, "tensors (48)") && has(out, "token_embd.weight"));
    free(out);
    /* A truncated copy: a clean BadFormat exit naming the file. */
    char cut[4096];
    snprintf(cut, sizeof cut, "%s/cut.gguf", test_tmpdir());
    qf_mapped_file mf;
    qf_error err;
    CHECK(qf_map_file(model, &mf, &err) == QF_OK);
    CHECK(qf_write_file_atomic(cut, mf.data, 9000, &err) == QF_OK);
    qf_unmap_file(&mf);
    snprintf(cmd, sizeof cmd, "'%s' info '%s' 2>&1", test_cli(), cut);
    out = run_cmd(cmd, &st);
    CHECK(out && WIFEXITED(st) && WEXITSTATUS(st) == qf_status_exit_code(QF_ERR_FORMAT));
    CHECK_MSG(out && has(out, "cut.gguf") && has(out, "BadFormat"), "%s", out ? out : "");
    free(out);
    unlink(cut);
}

int main(void) {
    RUN(open_every_model);
    RUN(open_every_vocab);
    RUN(lookup_stories260k);
    RUN(missing_file);
    RUN(every_truncation);
    RUN(hostile_base_is_valid);
    RUN(hostile_headers);
    RUN(arrays);
    RUN(writer_roundtrip_models);
    RUN(writer_roundtrip_vocab);
    RUN(writer_api);
    RUN(cli_info);
    return test_summary();
}
