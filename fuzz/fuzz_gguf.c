/* fuzz_gguf.c: libFuzzer harness for the GGUF reader. Opens the input as a GGUF buffer and,
 * when it is accepted, touches everything the reader hands out (every KV, array element at
 * any depth, tensor, and the first and last byte of every tensor's data) so ASan sees any
 * pointer the validation let through. Zero-byte tensors are invalid (every dimension is
 * positive); the reader refuses them and an accepted one aborts here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/gguf.h"

static volatile uint64_t sink;

static void walk(const qf_gguf *g, const qf_gguf_value *v, int depth) {
    if (v->type == QF_GGUF_STRING) {
        if (v->v.str.len) sink += (uint8_t)v->v.str.ptr[0] + (uint8_t)v->v.str.ptr[v->v.str.len - 1];
        return;
    }
    if (v->type != QF_GGUF_ARRAY) {
        sink += v->v.u64;
        return;
    }
    /* Every element, so the offset index is exercised end to end (inputs are small). */
    for (uint64_t i = 0; i < v->v.arr.count; i++) {
        qf_gguf_value e;
        if (!qf_gguf_array_get(g, v, i, &e)) abort(); /* in range: must succeed */
        walk(g, &e, depth + 1);
    }
    qf_gguf_value e;
    if (qf_gguf_array_get(g, v, v->v.arr.count, &e)) abort();
}

/* Look a name up through the public C-string API; names with a NUL inside are skipped. */
static char *cstr(const qf_gguf_str *s) {
    if (memchr(s->ptr, 0, s->len)) return NULL;
    char *c = malloc(s->len + 1);
    if (!c) return NULL;
    memcpy(c, s->ptr, s->len);
    c[s->len] = 0;
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qf_error err;
    qf_gguf *g = qf_gguf_open_buffer(data, size, "fuzz.gguf", &err);
    if (!g) {
        if (!strstr(err.msg, "fuzz.gguf")) abort(); /* every error names the file */
        return 0;
    }
    for (uint64_t i = 0; i < qf_gguf_n_kv(g); i++) {
        const qf_gguf_kv *kv = qf_gguf_kv_at(g, i);
        walk(g, &kv->value, 0);
        char *k = cstr(&kv->key);
        if (k) {
            if (qf_gguf_find(g, k) != &kv->value) abort();
            uint32_t u;
            int64_t i64;
            float f;
            bool b;
            char buf[64];
            sink += qf_gguf_get_u32(g, k, &u) + qf_gguf_get_i64(g, k, &i64) +
                    qf_gguf_get_f32(g, k, &f) + qf_gguf_get_bool(g, k, &b) +
                    qf_gguf_get_str(g, k, buf, sizeof buf);
            free(k);
        }
    }
    for (uint64_t i = 0; i < qf_gguf_n_tensors(g); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        /* Every dimension is positive, so no valid tensor is empty: the reader refuses a
         * tensor whose byte size is 0 (or wraps), and the harness holds it to that. */
        if (t->nbytes == 0) abort();
        sink += d[0] + d[t->nbytes - 1] + (uint64_t)qf_gguf_tensor_nelements(t);
        char *n = cstr(&t->name);
        if (n) {
            if (qf_gguf_find_tensor(g, n) != t) abort();
            free(n);
        }
    }
    qf_gguf_close(g);
    return 0;
}
