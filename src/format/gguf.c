/* gguf.c: the GGUF v2/v3 reader and writer. The reader trusts nothing in the file: every
 * count, length, offset and dimension is checked against the bytes that are really there
 * before it is used, and the first bad field is reported by name. Keys and tensor names are
 * hashed for lookup; arrays of variable-size elements (strings, nested arrays) get an offset
 * index at open so element i is O(1). */
#include "qforge/gguf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ARRAY_DEPTH 8 /* nested arrays: bounded so a hostile file cannot blow the stack */

/* Offsets (into the file) of the elements of one variable-size array, found by its data
 * pointer. Entries are appended in file order, so they are sorted by data pointer. */
typedef struct {
    const uint8_t *data;
    uint64_t *elem_off;
} arr_index;

struct qf_gguf {
    qf_mapped_file mf;
    bool mapped;
    const uint8_t *data;
    size_t size;
    char *name;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;

    uint64_t n_kv;
    qf_gguf_kv *kv;
    uint64_t *kv_hash; /* open addressing: index + 1, 0 = empty */
    uint64_t kv_hash_cap;

    uint64_t n_tensors;
    qf_gguf_tensor *tensors;
    uint64_t *t_hash;
    uint64_t t_hash_cap;

    arr_index *arrs;
    uint64_t n_arrs, cap_arrs;
};

/* ---- parsing state and errors ---- */

typedef struct {
    qf_gguf *g;
    size_t pos;
    char ctx[256]; /* the field being read, for error messages */
    qf_error *err;
} parser;

static qf_status pfail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static qf_status pfail(parser *p, const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->ctx[0])
        return qf_fail(p->err, QF_ERR_FORMAT, "%s: %s: %s", p->g->name, p->ctx, msg);
    return qf_fail(p->err, QF_ERR_FORMAT, "%s: %s", p->g->name, msg);
}

/* Printable, clipped copy of a name from the file (names can hold any byte). */
static void clean_name(char *out, size_t cap, const char *s, uint64_t len) {
    size_t n = 0;
    for (uint64_t i = 0; i < len && n + 4 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        out[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (len > 0 && n < len && n + 4 >= cap) {
        out[n++] = '.';
        out[n++] = '.';
        out[n++] = '.';
    }
    out[n] = 0;
}

static size_t remaining(const parser *p) { return p->g->size - p->pos; }

static bool rd(parser *p, void *dst, size_t n, const char *what) {
    if (n > remaining(p)) {
        pfail(p, "%s: needs %zu bytes at offset %zu, past end of file (size %zu)", what, n, p->pos,
              p->g->size);
        return false;
    }
    memcpy(dst, p->g->data + p->pos, n);
    p->pos += n;
    return true;
}

static bool rd_u32(parser *p, uint32_t *v, const char *what) { return rd(p, v, 4, what); }
static bool rd_u64(parser *p, uint64_t *v, const char *what) { return rd(p, v, 8, what); }

static bool rd_str(parser *p, qf_gguf_str *s, const char *what) {
    uint64_t len;
    if (!rd_u64(p, &len, what)) return false;
    if (len > remaining(p)) {
        pfail(p, "%s: string length %llu at offset %zu runs past end of file (size %zu)", what,
              (unsigned long long)len, p->pos - 8, p->g->size);
        return false;
    }
    s->ptr = (const char *)p->g->data + p->pos;
    s->len = len;
    p->pos += len;
    return true;
}

static size_t scalar_size(qf_gguf_type t) {
    switch (t) {
    case QF_GGUF_UINT8: case QF_GGUF_INT8: case QF_GGUF_BOOL: return 1;
    case QF_GGUF_UINT16: case QF_GGUF_INT16: return 2;
    case QF_GGUF_UINT32: case QF_GGUF_INT32: case QF_GGUF_FLOAT32: return 4;
    case QF_GGUF_UINT64: case QF_GGUF_INT64: case QF_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Decode a fixed-size scalar of type t at b (already bounds-checked). */
static void decode_scalar(qf_gguf_type t, const uint8_t *b, qf_gguf_value *out) {
    out->type = t;
    switch (t) {
    case QF_GGUF_UINT8: case QF_GGUF_BOOL: out->v.u64 = b[0]; break;
    case QF_GGUF_INT8: out->v.i64 = (int8_t)b[0]; break;
    case QF_GGUF_UINT16: { uint16_t x; memcpy(&x, b, 2); out->v.u64 = x; break; }
    case QF_GGUF_INT16: { int16_t x; memcpy(&x, b, 2); out->v.i64 = x; break; }
    case QF_GGUF_UINT32: { uint32_t x; memcpy(&x, b, 4); out->v.u64 = x; break; }
    case QF_GGUF_INT32: { int32_t x; memcpy(&x, b, 4); out->v.i64 = x; break; }
    case QF_GGUF_FLOAT32: { float x; memcpy(&x, b, 4); out->v.f64 = x; break; }
    case QF_GGUF_UINT64: { uint64_t x; memcpy(&x, b, 8); out->v.u64 = x; break; }
    case QF_GGUF_INT64: { int64_t x; memcpy(&x, b, 8); out->v.i64 = x; break; }
    case QF_GGUF_FLOAT64: { double x; memcpy(&x, b, 8); out->v.f64 = x; break; }
    default: break;
    }
}

static bool add_arr_index(parser *p, const uint8_t *data, uint64_t *elem_off) {
    qf_gguf *g = p->g;
    if (g->n_arrs == g->cap_arrs) {
        uint64_t cap = g->cap_arrs ? g->cap_arrs * 2 : 16;
        arr_index *a = realloc(g->arrs, cap * sizeof *a);
        if (!a) {
            qf_fail(p->err, QF_ERR_NOMEM, "%s: out of memory indexing arrays", g->name);
            return false;
        }
        g->arrs = a;
        g->cap_arrs = cap;
    }
    g->arrs[g->n_arrs++] = (arr_index){data, elem_off};
    return true;
}

static bool parse_value(parser *p, qf_gguf_type type, int depth, qf_gguf_value *out);

static bool parse_array(parser *p, int depth, qf_gguf_value *out) {
    if (depth >= GGUF_MAX_ARRAY_DEPTH) {
        pfail(p, "arrays nested deeper than %d levels", GGUF_MAX_ARRAY_DEPTH);
        return false;
    }
    uint32_t et;
    uint64_t count;
    if (!rd_u32(p, &et, "array element type") || !rd_u64(p, &count, "array count")) return false;
    if (et >= QF_GGUF_TYPE_COUNT) {
        pfail(p, "array element type %u is not a GGUF value type (0..%d)", et,
              QF_GGUF_TYPE_COUNT - 1);
        return false;
    }
    out->type = QF_GGUF_ARRAY;
    out->v.arr.elem_type = (qf_gguf_type)et;
    out->v.arr.count = count;
    out->v.arr.data = p->g->data + p->pos;
    size_t start = p->pos;
    size_t esz = scalar_size((qf_gguf_type)et);
    if (esz) {
        uint64_t nbytes;
        if (qf_mul_overflow_u64(count, esz, &nbytes) || nbytes > remaining(p)) {
            pfail(p, "array of %llu %s elements (%zu bytes each) at offset %zu runs past end of "
                     "file (size %zu)",
                  (unsigned long long)count, qf_gguf_type_name((qf_gguf_type)et), esz, p->pos,
                  p->g->size);
            return false;
        }
        p->pos += nbytes;
        out->v.arr.nbytes = nbytes;
        return true;
    }
    /* Strings take at least 8 bytes each, nested arrays at least 12: this bounds the index
     * allocation by the file size before anything is allocated. */
    size_t min_elem = et == QF_GGUF_STRING ? 8 : 12;
    if (count > remaining(p) / min_elem) {
        pfail(p, "array count %llu of %s elements at offset %zu cannot fit in the %zu bytes left",
              (unsigned long long)count, qf_gguf_type_name((qf_gguf_type)et), p->pos,
              remaining(p));
        return false;
    }
    uint64_t *off = NULL;
    if (count) {
        off = malloc(count * sizeof *off);
        if (!off) {
            qf_fail(p->err, QF_ERR_NOMEM, "%s: out of memory for an array of %llu elements",
                    p->g->name, (unsigned long long)count);
            return false;
        }
        if (!add_arr_index(p, out->v.arr.data, off)) {
            free(off);
            return false;
        }
    }
    for (uint64_t i = 0; i < count; i++) {
        off[i] = p->pos;
        qf_gguf_value elem;
        if (et == QF_GGUF_STRING) {
            size_t at = p->pos;
            if (!rd_str(p, &elem.v.str, "array string element")) {
                pfail(p, "array element %llu of %llu: string at offset %zu runs past end of file "
                         "(size %zu)",
                      (unsigned long long)i, (unsigned long long)count, at, p->g->size);
                return false;
            }
        } else if (!parse_array(p, depth + 1, &elem)) {
            return false;
        }
    }
    out->v.arr.nbytes = p->pos - start;
    return true;
}

static bool parse_value(parser *p, qf_gguf_type type, int depth, qf_gguf_value *out) {
    memset(out, 0, sizeof *out);
    out->type = type;
    if (type == QF_GGUF_STRING) return rd_str(p, &out->v.str, "string value");
    if (type == QF_GGUF_ARRAY) return parse_array(p, depth, out);
    size_t n = scalar_size(type);
    uint8_t b[8];
    if (!rd(p, b, n, "value")) return false;
    decode_scalar(type, b, out);
    return true;
}

/* ---- name hashing (keys and tensor names) ---- */

static uint64_t hash_bytes(const char *s, uint64_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t hash_cap_for(uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

/* Insert entry idx (name = names(idx)); returns the index of an existing entry with the
 * same name, or UINT64_MAX when inserted. */
static uint64_t hash_insert(uint64_t *table, uint64_t cap, const qf_gguf_str *name,
                            const qf_gguf_str *(*name_of)(const qf_gguf *, uint64_t),
                            const qf_gguf *g, uint64_t idx) {
    uint64_t h = hash_bytes(name->ptr, name->len) & (cap - 1);
    for (;;) {
        if (!table[h]) {
            table[h] = idx + 1;
            return UINT64_MAX;
        }
        const qf_gguf_str *o = name_of(g, table[h] - 1);
        if (o->len == name->len && memcmp(o->ptr, name->ptr, name->len) == 0) return table[h] - 1;
        h = (h + 1) & (cap - 1);
    }
}

static uint64_t hash_find(const uint64_t *table, uint64_t cap, const char *s, size_t n,
                          const qf_gguf_str *(*name_of)(const qf_gguf *, uint64_t),
                          const qf_gguf *g) {
    if (!table) return UINT64_MAX;
    uint64_t h = hash_bytes(s, n) & (cap - 1);
    while (table[h]) {
        const qf_gguf_str *o = name_of(g, table[h] - 1);
        if (o->len == n && memcmp(o->ptr, s, n) == 0) return table[h] - 1;
        h = (h + 1) & (cap - 1);
    }
    return UINT64_MAX;
}

static const qf_gguf_str *kv_name(const qf_gguf *g, uint64_t i) { return &g->kv[i].key; }
static const qf_gguf_str *tensor_name(const qf_gguf *g, uint64_t i) { return &g->tensors[i].name; }

/* ---- open ---- */

static bool parse_header_and_kv(parser *p) {
    qf_gguf *g = p->g;
    char magic[4];
    if (!rd(p, magic, 4, "magic")) return false;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0) {
        pfail(p, "magic: expected \"GGUF\", found bytes %02x %02x %02x %02x (not a GGUF file)",
              (unsigned char)magic[0], (unsigned char)magic[1], (unsigned char)magic[2],
              (unsigned char)magic[3]);
        return false;
    }
    if (!rd_u32(p, &g->version, "version")) return false;
    if (g->version != 2 && g->version != 3) {
        if (g->version == 1)
            pfail(p, "version: GGUF v1 (32-bit counts) is not supported, expected 2 or 3");
        else if ((g->version & 0xffff) == 0 && g->version)
            pfail(p, "version: %u looks byte-swapped (big-endian GGUF?), expected 2 or 3",
                  g->version);
        else
            pfail(p, "version: %u is not supported, expected 2 or 3", g->version);
        return false;
    }
    if (!rd_u64(p, &g->n_tensors, "tensor count") || !rd_u64(p, &g->n_kv, "metadata kv count"))
        return false;
    /* Smallest possible records: a KV is key length (8) + type (4) + a 1-byte value; a tensor
     * info is name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8). */
    if (g->n_kv > remaining(p) / 13) {
        pfail(p, "metadata kv count: %llu entries cannot fit in the %zu bytes left",
              (unsigned long long)g->n_kv, remaining(p));
        return false;
    }
    if (g->n_tensors > remaining(p) / 32) {
        pfail(p, "tensor count: %llu tensors cannot fit in the %zu bytes left",
              (unsigned long long)g->n_tensors, remaining(p));
        return false;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->kv_hash_cap = hash_cap_for(g->n_kv);
    g->kv_hash = calloc(g->kv_hash_cap, sizeof *g->kv_hash);
    if (!g->kv || !g->kv_hash) {
        qf_fail(p->err, QF_ERR_NOMEM, "%s: out of memory for %llu metadata entries", g->name,
                (unsigned long long)g->n_kv);
        return false;
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        qf_gguf_kv *kv = &g->kv[i];
        snprintf(p->ctx, sizeof p->ctx, "kv %llu", (unsigned long long)i);
        if (!rd_str(p, &kv->key, "key")) return false;
        char nm[96];
        clean_name(nm, sizeof nm, kv->key.ptr, kv->key.len);
        snprintf(p->ctx, sizeof p->ctx, "kv %llu '%s'", (unsigned long long)i, nm);
        if (kv->key.len == 0) {
            pfail(p, "key: empty key name");
            return false;
        }
        uint32_t t;
        if (!rd_u32(p, &t, "value type")) return false;
        if (t >= QF_GGUF_TYPE_COUNT) {
            pfail(p, "value type %u is not a GGUF value type (0..%d)", t, QF_GGUF_TYPE_COUNT - 1);
            return false;
        }
        if (!parse_value(p, (qf_gguf_type)t, 0, &kv->value)) return false;
        uint64_t dup = hash_insert(g->kv_hash, g->kv_hash_cap, &kv->key, kv_name, g, i);
        if (dup != UINT64_MAX) {
            pfail(p, "duplicate key (first defined as kv %llu)", (unsigned long long)dup);
            return false;
        }
    }
    p->ctx[0] = 0;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const qf_gguf_value *a = qf_gguf_find(g, "general.alignment");
    if (a) {
        snprintf(p->ctx, sizeof p->ctx, "key 'general.alignment'");
        if (a->type != QF_GGUF_UINT32) {
            pfail(p, "expected type uint32, found %s", qf_gguf_type_name(a->type));
            return false;
        }
        if (a->v.u64 == 0 || (a->v.u64 & (a->v.u64 - 1)) != 0) {
            pfail(p, "%llu is not a nonzero power of two", (unsigned long long)a->v.u64);
            return false;
        }
        g->alignment = a->v.u64;
        p->ctx[0] = 0;
    }
    return true;
}

static int cmp_by_offset(const void *a, const void *b) {
    const qf_gguf_tensor *x = *(const qf_gguf_tensor *const *)a;
    const qf_gguf_tensor *y = *(const qf_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static bool parse_tensors(parser *p) {
    qf_gguf *g = p->g;
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    g->t_hash_cap = hash_cap_for(g->n_tensors);
    g->t_hash = calloc(g->t_hash_cap, sizeof *g->t_hash);
    if (!g->tensors || !g->t_hash) {
        qf_fail(p->err, QF_ERR_NOMEM, "%s: out of memory for %llu tensors", g->name,
                (unsigned long long)g->n_tensors);
        return false;
    }
    /* Tensor infos first (the data section starts after them), data checks second. */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        qf_gguf_tensor *t = &g->tensors[i];
        snprintf(p->ctx, sizeof p->ctx, "tensor %llu", (unsigned long long)i);
        if (!rd_str(p, &t->name, "name")) return false;
        char nm[96];
        clean_name(nm, sizeof nm, t->name.ptr, t->name.len);
        snprintf(p->ctx, sizeof p->ctx, "tensor %llu '%s'", (unsigned long long)i, nm);
        if (t->name.len == 0) {
            pfail(p, "name: empty tensor name");
            return false;
        }
        if (!rd_u32(p, &t->n_dims, "n_dims")) return false;
        if (t->n_dims < 1 || t->n_dims > QF_GGUF_MAX_DIMS) {
            pfail(p, "n_dims: %u, expected 1..%d", t->n_dims, QF_GGUF_MAX_DIMS);
            return false;
        }
        int64_t nel = 1;
        for (int d = 0; d < QF_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if (!rd(p, &t->ne[d], 8, "dimension")) return false;
            if (t->ne[d] <= 0) {
                pfail(p, "ne[%u] = %lld, expected a positive dimension", d, (long long)t->ne[d]);
                return false;
            }
            if (__builtin_mul_overflow(nel, t->ne[d], &nel)) {
                pfail(p, "ne[%u] = %lld: element count overflows 64 bits", d, (long long)t->ne[d]);
                return false;
            }
        }
        uint32_t type;
        if (!rd_u32(p, &type, "type")) return false;
        if (type >= QF_TYPE_COUNT || !qf_type_is_known((qf_type)type)) {
            pfail(p, "type: %u is not a known ggml tensor type", type);
            return false;
        }
        t->type = (qf_type)type;
        int64_t blk = qf_type_block_elems(t->type);
        if (blk <= 0 || t->ne[0] % blk != 0) {
            pfail(p, "ne[0] = %lld is not a multiple of the %s block size %lld",
                  (long long)t->ne[0], qf_type_name(t->type), (long long)blk);
            return false;
        }
        /* (ne[0] / blk) * block bytes, overflow-checked: qf_row_bytes() would wrap for a huge
         * ne[0] (2^62 f32 elements is 2^64 bytes = 0), and a tensor that claims zero bytes
         * must never get past here: every dimension is positive, so no valid tensor is empty. */
        uint64_t nbytes;
        if (qf_mul_overflow_u64((uint64_t)(t->ne[0] / blk), qf_type_block_bytes(t->type), &nbytes)) {
            pfail(p, "byte size overflows 64 bits");
            return false;
        }
        for (int d = 1; d < QF_GGUF_MAX_DIMS; d++) {
            if (qf_mul_overflow_u64(nbytes, (uint64_t)t->ne[d], &nbytes)) {
                pfail(p, "byte size overflows 64 bits");
                return false;
            }
        }
        if (nbytes == 0) {
            pfail(p, "zero-byte tensor (type %s has no size)", qf_type_name(t->type));
            return false;
        }
        t->nbytes = nbytes;
        if (!rd_u64(p, &t->offset, "offset")) return false;
        uint64_t dup = hash_insert(g->t_hash, g->t_hash_cap, &t->name, tensor_name, g, i);
        if (dup != UINT64_MAX) {
            pfail(p, "duplicate tensor name (first defined as tensor %llu)",
                  (unsigned long long)dup);
            return false;
        }
    }
    p->ctx[0] = 0;
    uint64_t off = p->pos, pad = (g->alignment - off % g->alignment) % g->alignment;
    if (qf_add_overflow_u64(off, pad, &g->data_offset)) g->data_offset = UINT64_MAX;
    if (g->n_tensors == 0) {
        /* Tensor-less files (vocabularies) may end without padding. */
        if (g->data_offset > g->size) g->data_offset = g->size;
        return true;
    }
    if (g->data_offset > g->size) {
        pfail(p, "data section: starts at offset %llu (after alignment to %llu), past end of "
                 "file (size %zu)",
              (unsigned long long)g->data_offset, (unsigned long long)g->alignment, g->size);
        return false;
    }
    uint64_t data_size = g->size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        qf_gguf_tensor *t = &g->tensors[i];
        char nm[96];
        clean_name(nm, sizeof nm, t->name.ptr, t->name.len);
        snprintf(p->ctx, sizeof p->ctx, "tensor %llu '%s'", (unsigned long long)i, nm);
        if (t->offset % g->alignment != 0) {
            pfail(p, "offset %llu is not a multiple of the alignment %llu",
                  (unsigned long long)t->offset, (unsigned long long)g->alignment);
            return false;
        }
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            pfail(p, "data [%llu, +%llu) at file offset %llu runs past end of file (size %zu)",
                  (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                  (unsigned long long)(g->data_offset + t->offset), g->size);
            return false;
        }
        t->data = g->data + g->data_offset + t->offset;
    }
    p->ctx[0] = 0;
    qf_gguf_tensor **order = malloc(g->n_tensors * sizeof *order);
    if (!order) {
        qf_fail(p->err, QF_ERR_NOMEM, "%s: out of memory", g->name);
        return false;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
    qsort(order, g->n_tensors, sizeof *order, cmp_by_offset);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        const qf_gguf_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->nbytes > b->offset) {
            char na[96], nb[96];
            clean_name(na, sizeof na, a->name.ptr, a->name.len);
            clean_name(nb, sizeof nb, b->name.ptr, b->name.len);
            pfail(p, "tensor %llu '%s': data [%llu, %llu) overlaps tensor %llu '%s' at %llu",
                  (unsigned long long)(b - g->tensors), nb, (unsigned long long)b->offset,
                  (unsigned long long)(b->offset + b->nbytes), (unsigned long long)(a - g->tensors),
                  na, (unsigned long long)a->offset);
            free(order);
            return false;
        }
    }
    free(order);
    return true;
}

static qf_gguf *open_common(qf_gguf *g, qf_error *err) {
    parser p = {.g = g, .pos = 0, .err = err};
    p.ctx[0] = 0;
    if (!parse_header_and_kv(&p) || !parse_tensors(&p)) {
        qf_gguf_close(g);
        return NULL;
    }
    return g;
}

qf_gguf *qf_gguf_open_buffer(const void *data, size_t size, const char *name, qf_error *err) {
    qf_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->name = strdup(name ? name : "<buffer>"))) {
        free(g);
        qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", name ? name : "<buffer>");
        return NULL;
    }
    g->data = data;
    g->size = data ? size : 0;
    return open_common(g, err);
}

qf_gguf *qf_gguf_open(const char *path, qf_error *err) {
    qf_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->name = strdup(path))) {
        free(g);
        qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    if (qf_map_file(path, &g->mf, err) != QF_OK) {
        free(g->name);
        free(g);
        return NULL;
    }
    g->mapped = true;
    g->data = g->mf.data;
    g->size = g->mf.size;
    return open_common(g, err);
}

void qf_gguf_close(qf_gguf *g) {
    if (!g) return;
    for (uint64_t i = 0; i < g->n_arrs; i++) free(g->arrs[i].elem_off);
    free(g->arrs);
    free(g->kv);
    free(g->kv_hash);
    free(g->tensors);
    free(g->t_hash);
    if (g->mapped) qf_unmap_file(&g->mf);
    free(g->name);
    free(g);
}

/* ---- accessors ---- */

const char *qf_gguf_path(const qf_gguf *g) { return g->name; }
uint32_t qf_gguf_version(const qf_gguf *g) { return g->version; }
uint64_t qf_gguf_alignment(const qf_gguf *g) { return g->alignment; }
uint64_t qf_gguf_data_offset(const qf_gguf *g) { return g->data_offset; }
const uint8_t *qf_gguf_file_data(const qf_gguf *g, size_t *size) {
    if (size) *size = g->size;
    return g->data;
}

uint64_t qf_gguf_n_kv(const qf_gguf *g) { return g->n_kv; }
const qf_gguf_kv *qf_gguf_kv_at(const qf_gguf *g, uint64_t i) {
    return i < g->n_kv ? &g->kv[i] : NULL;
}

const qf_gguf_value *qf_gguf_find(const qf_gguf *g, const char *key) {
    uint64_t i = hash_find(g->kv_hash, g->kv_hash_cap, key, strlen(key), kv_name, g);
    return i == UINT64_MAX ? NULL : &g->kv[i].value;
}

static bool is_uint(qf_gguf_type t) {
    return t == QF_GGUF_UINT8 || t == QF_GGUF_UINT16 || t == QF_GGUF_UINT32 || t == QF_GGUF_UINT64;
}
static bool is_sint(qf_gguf_type t) {
    return t == QF_GGUF_INT8 || t == QF_GGUF_INT16 || t == QF_GGUF_INT32 || t == QF_GGUF_INT64;
}

bool qf_gguf_get_u32(const qf_gguf *g, const char *key, uint32_t *out) {
    const qf_gguf_value *v = qf_gguf_find(g, key);
    if (!v) return false;
    if (is_uint(v->type) && v->v.u64 <= UINT32_MAX) {
        *out = (uint32_t)v->v.u64;
        return true;
    }
    if (is_sint(v->type) && v->v.i64 >= 0 && v->v.i64 <= (int64_t)UINT32_MAX) {
        *out = (uint32_t)v->v.i64;
        return true;
    }
    return false;
}

bool qf_gguf_get_i64(const qf_gguf *g, const char *key, int64_t *out) {
    const qf_gguf_value *v = qf_gguf_find(g, key);
    if (!v) return false;
    if (is_uint(v->type) && v->v.u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->v.u64;
        return true;
    }
    if (is_sint(v->type)) {
        *out = v->v.i64;
        return true;
    }
    return false;
}

bool qf_gguf_get_f32(const qf_gguf *g, const char *key, float *out) {
    const qf_gguf_value *v = qf_gguf_find(g, key);
    if (!v) return false;
    if (v->type == QF_GGUF_FLOAT32 || v->type == QF_GGUF_FLOAT64) *out = (float)v->v.f64;
    else if (is_uint(v->type)) *out = (float)v->v.u64;
    else if (is_sint(v->type)) *out = (float)v->v.i64;
    else return false;
    return true;
}

bool qf_gguf_get_bool(const qf_gguf *g, const char *key, bool *out) {
    const qf_gguf_value *v = qf_gguf_find(g, key);
    if (!v || v->type != QF_GGUF_BOOL) return false;
    *out = v->v.u64 != 0;
    return true;
}

bool qf_gguf_get_str(const qf_gguf *g, const char *key, char *buf, size_t cap) {
    const qf_gguf_value *v = qf_gguf_find(g, key);
    if (!v || v->type != QF_GGUF_STRING || cap == 0 || v->v.str.len >= cap) return false;
    memcpy(buf, v->v.str.ptr, v->v.str.len);
    buf[v->v.str.len] = 0;
    return true;
}

static const arr_index *find_arr_index(const qf_gguf *g, const uint8_t *data) {
    uint64_t lo = 0, hi = g->n_arrs;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (g->arrs[mid].data < data) lo = mid + 1;
        else hi = mid;
    }
    return lo < g->n_arrs && g->arrs[lo].data == data ? &g->arrs[lo] : NULL;
}

bool qf_gguf_array_get(const qf_gguf *g, const qf_gguf_value *arr, uint64_t i, qf_gguf_value *out) {
    if (!arr || arr->type != QF_GGUF_ARRAY || i >= arr->v.arr.count) return false;
    qf_gguf_type et = arr->v.arr.elem_type;
    size_t esz = scalar_size(et);
    if (esz) {
        memset(out, 0, sizeof *out);
        decode_scalar(et, arr->v.arr.data + i * esz, out);
        return true;
    }
    const arr_index *ix = find_arr_index(g, arr->v.arr.data);
    if (!ix) return false;
    /* Element bytes were validated at open; decode them again without re-checking. */
    const uint8_t *e = g->data + ix->elem_off[i];
    memset(out, 0, sizeof *out);
    out->type = et;
    if (et == QF_GGUF_STRING) {
        memcpy(&out->v.str.len, e, 8);
        out->v.str.ptr = (const char *)e + 8;
        return true;
    }
    uint32_t inner;
    memcpy(&inner, e, 4);
    out->v.arr.elem_type = (qf_gguf_type)inner;
    memcpy(&out->v.arr.count, e + 4, 8);
    out->v.arr.data = e + 12;
    const uint8_t *end = i + 1 < arr->v.arr.count ? g->data + ix->elem_off[i + 1]
                                                  : arr->v.arr.data + arr->v.arr.nbytes;
    out->v.arr.nbytes = (uint64_t)(end - out->v.arr.data);
    return true;
}

uint64_t qf_gguf_n_tensors(const qf_gguf *g) { return g->n_tensors; }
const qf_gguf_tensor *qf_gguf_tensor_at(const qf_gguf *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const qf_gguf_tensor *qf_gguf_find_tensor(const qf_gguf *g, const char *name) {
    uint64_t i = hash_find(g->t_hash, g->t_hash_cap, name, strlen(name), tensor_name, g);
    return i == UINT64_MAX ? NULL : &g->tensors[i];
}

int64_t qf_gguf_tensor_nelements(const qf_gguf_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

const char *qf_gguf_type_name(qf_gguf_type t) {
    static const char *const names[QF_GGUF_TYPE_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
        "bool", "string", "array", "uint64", "int64", "float64",
    };
    return (unsigned)t < QF_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* ---- writer ----
 * Values are held in their file encoding (type id kept apart), so a value copied from an
 * opened file is a byte copy of the mapping and the written file can match the source. */

typedef struct {
    char *key;
    size_t key_len;
    uint32_t type;
    uint8_t *blob; /* the encoded value, as it follows the type id in the file */
    size_t blob_len;
} wkv;

typedef struct {
    char *name;
    qf_type type;
    uint32_t n_dims;
    int64_t ne[QF_GGUF_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} wtensor;

struct qf_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

qf_gguf_writer *qf_gguf_writer_new(void) { return calloc(1, sizeof(qf_gguf_writer)); }

void qf_gguf_writer_free(qf_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].blob);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

/* Set key (len bytes) to an encoded value; takes ownership of blob in every case. */
static qf_status set_blob(qf_gguf_writer *w, const char *key, size_t key_len, uint32_t type,
                          uint8_t *blob, size_t blob_len) {
    for (size_t i = 0; i < w->n_kv; i++) {
        wkv *kv = &w->kv[i];
        if (kv->key_len == key_len && memcmp(kv->key, key, key_len) == 0) {
            free(kv->blob);
            kv->type = type;
            kv->blob = blob;
            kv->blob_len = blob_len;
            return QF_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *n = realloc(w->kv, cap * sizeof *n);
        if (!n) {
            free(blob);
            return QF_ERR_NOMEM;
        }
        w->kv = n;
        w->cap_kv = cap;
    }
    char *k = malloc(key_len + 1);
    if (!k) {
        free(blob);
        return QF_ERR_NOMEM;
    }
    memcpy(k, key, key_len);
    k[key_len] = 0;
    w->kv[w->n_kv++] = (wkv){k, key_len, type, blob, blob_len};
    return QF_OK;
}

static qf_status set_bytes(qf_gguf_writer *w, const char *key, uint32_t type, const void *b,
                           size_t n) {
    uint8_t *blob = malloc(n ? n : 1);
    if (!blob) return QF_ERR_NOMEM;
    memcpy(blob, b, n);
    return set_blob(w, key, strlen(key), type, blob, n);
}

qf_status qf_gguf_writer_set_u32(qf_gguf_writer *w, const char *key, uint32_t v) {
    return set_bytes(w, key, QF_GGUF_UINT32, &v, 4);
}
qf_status qf_gguf_writer_set_f32(qf_gguf_writer *w, const char *key, float v) {
    return set_bytes(w, key, QF_GGUF_FLOAT32, &v, 4);
}
qf_status qf_gguf_writer_set_bool(qf_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v;
    return set_bytes(w, key, QF_GGUF_BOOL, &b, 1);
}
qf_status qf_gguf_writer_set_str(qf_gguf_writer *w, const char *key, const char *v) {
    uint64_t len = strlen(v);
    uint8_t *blob = malloc(8 + len);
    if (!blob) return QF_ERR_NOMEM;
    memcpy(blob, &len, 8);
    memcpy(blob + 8, v, len);
    return set_blob(w, key, strlen(key), QF_GGUF_STRING, blob, 8 + len);
}

/* Encode a value read by the reader: scalars from their widened fields, strings and arrays
 * as the raw bytes they occupy in the source mapping. */
static uint8_t *encode_value(const qf_gguf_value *v, size_t *len) {
    size_t n = scalar_size(v->type);
    uint8_t *b = NULL;
    if (n) {
        if (!(b = malloc(8))) return NULL;
        switch (v->type) {
        case QF_GGUF_UINT8: case QF_GGUF_BOOL: b[0] = (uint8_t)v->v.u64; break;
        case QF_GGUF_INT8: b[0] = (uint8_t)(int8_t)v->v.i64; break;
        case QF_GGUF_UINT16: { uint16_t x = (uint16_t)v->v.u64; memcpy(b, &x, 2); break; }
        case QF_GGUF_INT16: { int16_t x = (int16_t)v->v.i64; memcpy(b, &x, 2); break; }
        case QF_GGUF_UINT32: { uint32_t x = (uint32_t)v->v.u64; memcpy(b, &x, 4); break; }
        case QF_GGUF_INT32: { int32_t x = (int32_t)v->v.i64; memcpy(b, &x, 4); break; }
        case QF_GGUF_FLOAT32: { float x = (float)v->v.f64; memcpy(b, &x, 4); break; }
        case QF_GGUF_UINT64: memcpy(b, &v->v.u64, 8); break;
        case QF_GGUF_INT64: memcpy(b, &v->v.i64, 8); break;
        case QF_GGUF_FLOAT64: memcpy(b, &v->v.f64, 8); break;
        default: break;
        }
    } else if (v->type == QF_GGUF_STRING) {
        n = 8 + v->v.str.len;
        if (!(b = malloc(n))) return NULL;
        memcpy(b, &v->v.str.len, 8);
        if (v->v.str.len) memcpy(b + 8, v->v.str.ptr, v->v.str.len);
    } else if (v->type == QF_GGUF_ARRAY) {
        n = 12 + v->v.arr.nbytes;
        if (!(b = malloc(n))) return NULL;
        uint32_t et = v->v.arr.elem_type;
        memcpy(b, &et, 4);
        memcpy(b + 4, &v->v.arr.count, 8);
        if (v->v.arr.nbytes) memcpy(b + 12, v->v.arr.data, v->v.arr.nbytes);
    } else {
        return NULL;
    }
    *len = n;
    return b;
}

qf_status qf_gguf_writer_set_value(qf_gguf_writer *w, const char *key, const qf_gguf *src,
                                   const qf_gguf_value *v) {
    if ((unsigned)v->type >= QF_GGUF_TYPE_COUNT) return QF_ERR_ARG;
    size_t n;
    uint8_t *b = encode_value(v, &n);
    if (!b) return QF_ERR_NOMEM;
    return set_blob(w, key, strlen(key), v->type, b, n);
}

qf_status qf_gguf_writer_copy_kv(qf_gguf_writer *w, const qf_gguf *src, const char *skip_prefix,
                                 qf_error *err) {
    size_t plen = skip_prefix ? strlen(skip_prefix) : 0;
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const qf_gguf_kv *kv = &src->kv[i];
        if (plen && kv->key.len >= plen && memcmp(kv->key.ptr, skip_prefix, plen) == 0) continue;
        size_t n;
        uint8_t *b = encode_value(&kv->value, &n);
        if (!b || set_blob(w, kv->key.ptr, kv->key.len, kv->value.type, b, n) != QF_OK)
            return qf_fail(err, QF_ERR_NOMEM, "%s: out of memory copying metadata", src->name);
    }
    return QF_OK;
}

qf_status qf_gguf_writer_add_tensor(qf_gguf_writer *w, const char *name, qf_type type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    uint64_t nbytes, qf_error *err) {
    if (!name || !*name) return qf_fail(err, QF_ERR_ARG, "gguf writer: tensor name is empty");
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return qf_fail(err, QF_ERR_ARG, "gguf writer: tensor '%s' added twice", name);
    if (!qf_type_is_known(type))
        return qf_fail(err, QF_ERR_ARG, "gguf writer: tensor '%s': unknown type %d", name, type);
    if (n_dims < 1 || n_dims > QF_GGUF_MAX_DIMS)
        return qf_fail(err, QF_ERR_ARG, "gguf writer: tensor '%s': n_dims %u, expected 1..%d",
                       name, n_dims, QF_GGUF_MAX_DIMS);
    wtensor t = {.type = type, .n_dims = n_dims, .data = data, .nbytes = nbytes};
    uint64_t expect = 0;
    for (int d = 0; d < QF_GGUF_MAX_DIMS; d++) t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] <= 0)
            return qf_fail(err, QF_ERR_ARG, "gguf writer: tensor '%s': ne[%u] = %lld, expected > 0",
                           name, d, (long long)ne[d]);
    expect = qf_row_bytes(type, t.ne[0]);
    if (expect == 0)
        return qf_fail(err, QF_ERR_ARG,
                       "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block "
                       "size %lld",
                       name, (long long)t.ne[0], qf_type_name(type),
                       (long long)qf_type_block_elems(type));
    for (int d = 1; d < QF_GGUF_MAX_DIMS; d++)
        if (qf_mul_overflow_u64(expect, (uint64_t)t.ne[d], &expect))
            return qf_fail(err, QF_ERR_ARG, "gguf writer: tensor '%s': size overflows", name);
    if (expect != nbytes)
        return qf_fail(err, QF_ERR_ARG,
                       "gguf writer: tensor '%s': %llu data bytes given, shape and type need %llu",
                       name, (unsigned long long)nbytes, (unsigned long long)expect);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *n = realloc(w->t, cap * sizeof *n);
        if (!n) return qf_fail(err, QF_ERR_NOMEM, "gguf writer: out of memory");
        w->t = n;
        w->cap_t = cap;
    }
    if (!(t.name = strdup(name))) return qf_fail(err, QF_ERR_NOMEM, "gguf writer: out of memory");
    w->t[w->n_t++] = t;
    return QF_OK;
}

static qf_status write_pad(qf_atomic_file *af, uint64_t pos, uint64_t align, qf_error *err) {
    static const uint8_t zeros[4096];
    uint64_t pad = (align - pos % align) % align;
    while (pad) {
        size_t n = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        qf_status s = qf_atomic_write(af, zeros, n, err);
        if (s != QF_OK) return s;
        pad -= n;
    }
    return QF_OK;
}

static uint64_t pad_to(uint64_t n, uint64_t align) { return n + (align - n % align) % align; }

qf_status qf_gguf_writer_write(qf_gguf_writer *w, const char *path, qf_error *err) {
    uint64_t align = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        if (strcmp(kv->key, "general.alignment") != 0 || kv->key_len != strlen(kv->key)) continue;
        uint32_t a = 0;
        if (kv->type != QF_GGUF_UINT32 || (memcpy(&a, kv->blob, 4), a == 0) || (a & (a - 1)))
            return qf_fail(err, QF_ERR_ARG,
                           "%s: general.alignment must be a uint32 nonzero power of two", path);
        align = a;
    }
    qf_atomic_file af;
    qf_status s = qf_atomic_open(&af, path, err);
    if (s != QF_OK) return s;
    uint64_t pos = 0;
#define PUT(ptr, n)                                                      \
    do {                                                                 \
        if ((s = qf_atomic_write(&af, (ptr), (n), err)) != QF_OK) goto fail; \
        pos += (n);                                                      \
    } while (0)
    uint32_t version = 3;
    uint64_t n_t = w->n_t, n_kv = w->n_kv;
    PUT(GGUF_MAGIC, 4);
    PUT(&version, 4);
    PUT(&n_t, 8);
    PUT(&n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        uint64_t kl = kv->key_len;
        PUT(&kl, 8);
        PUT(kv->key, kv->key_len);
        PUT(&kv->type, 4);
        PUT(kv->blob, kv->blob_len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        uint32_t type = t->type;
        PUT(&nl, 8);
        PUT(t->name, nl);
        PUT(&t->n_dims, 4);
        PUT(t->ne, 8 * (size_t)t->n_dims);
        PUT(&type, 4);
        PUT(&off, 8);
        off = pad_to(off + t->nbytes, align);
    }
    /* Like llama.cpp, a tensor-less file (a vocabulary) ends right after its metadata. */
    if (w->n_t) {
        if ((s = write_pad(&af, pos, align, err)) != QF_OK) goto fail;
        for (size_t i = 0; i < w->n_t; i++) {
            const wtensor *t = &w->t[i];
            if (t->nbytes) {
                if ((s = qf_atomic_write(&af, t->data, t->nbytes, err)) != QF_OK) goto fail;
            }
            if ((s = write_pad(&af, t->nbytes, align, err)) != QF_OK) goto fail;
        }
    }
#undef PUT
    return qf_atomic_commit(&af, err);
fail:
    qf_atomic_abort(&af);
    return s;
}
