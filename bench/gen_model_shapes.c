/* gen_model_shapes.c: write a random-weight GGUF with the shapes of a real model, for GPU
 * benchmarks at real sizes without shipping weights.
 *
 *   build/bench/gen_model_shapes --shape llama3-8b|llama3.2-1b|qwen2.5-0.5b|tiny-hd8|tiny-qwen2|test-d2048
 *       --type f16|q4_0|q8_0|f32|q4_k|q5_k|q6_k|q4_k_m
 *       [--vocab-from GGUF] [--layers N] -o OUT.gguf
 *
 * Shapes (n_layer, n_embd, heads/kv heads, head_dim, n_ff, vocab, rope base): Llama-3-8B
 * 32/4096/32/8/128/14336/128256/5e5, untied output; Llama-3.2-1B 16/2048/32/8/64/8192/128256/5e5,
 * tied; Qwen2.5-0.5B (qwen2: Q/K/V bias, NEOX rope) 24/896/14/2/64/4864/151936/1e6, tied.
 * The tokenizer (tokenizer.* keys) is copied from --vocab-from (default: the embedded demo
 * model, a byte-level BPE like llama-3's); its ids are a prefix of the model's vocabulary, and its
 * per-token arrays are padded with reserved control tokens to the shape's vocabulary so that
 * llama.cpp loads the file too (bench/bench_1b.sh runs both on it).
 * Weights: N(0, 0.02)-like values quantized with qf_quantize_row; every matrix of one type
 * shares one random pool (the values do not matter to a throughput benchmark), norms are 1.
 * The K formats (q4_k, q5_k, q6_k), which qforge does not quantize to, are random bits with
 * super-block scales that keep weights within about +-0.02. q4_k_m mixes them as llama.cpp's
 * Q4_K_M does: q6_k for the output, and for attn_v / ffn_down of the first and last eighth of
 * the layers and every third layer between; q4_k everywhere else. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant_blocks.h"
#include "qforge/gguf.h"
#include "qforge/quant.h"
#include "util/util.h"

typedef struct {
    const char *name, *arch, *gname;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    float rope_base;
    int tied, bias;
} shape;

static const shape shapes[] = {
    {"llama3-8b", "llama", "Llama-3-8B-shaped (random weights)", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0f, 0, 0},
    {"llama3.2-1b", "llama", "Llama-3.2-1B-shaped (random weights)", 16, 2048, 32, 8, 64, 8192, 128256, 500000.0f, 1, 0},
    {"qwen2.5-0.5b", "qwen2", "Qwen2.5-0.5B-shaped (random weights)", 24, 896, 14, 2, 64, 4864, 151936, 1000000.0f, 1, 1},
    /* test fixtures for a fresh clone (tests/helpers/make_fixtures.sh), the demo tokenizer's 4096
     * ids: stories260K's shape (head_dim 8, GQA 8/4, ffn 172, 5 layers, tied) and qforge-demo-
     * qwen2-5m's (Q/K/V bias, NEOX rope base 1e6, untied output) */
    {"tiny-hd8", "llama", "stories260K-shaped (random weights)", 5, 64, 8, 4, 8, 172, 4096, 10000.0f, 1, 0},
    {"tiny-qwen2", "qwen2", "qwen2-5m-shaped (random weights)", 4, 256, 4, 2, 64, 768, 4096, 1000000.0f, 0, 1},
    /* test_cuda's wide decode fixture (gpu_device_bundle.sh's prepare.sh): rows of 2048 and more,
     * so the one-token G8 kernels run (n_ff >= 8192: the down rows' variant too) */
    {"test-d2048", "llama", "2048-wide test model (random weights)", 2, 2048, 16, 4, 128, 8448, 4096, 500000.0f, 0, 0},
};

static uint64_t rs = 0x243F6A8885A308D3ull;
static float grand(void) { /* sum of 4 uniforms: roughly normal, std 1 */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        s += (float)((qf_xorshift64s(&rs) >> 40) * (1.0 / 16777216.0)) - 0.5f;
    }
    return s * 1.7320508f;
}

/* a pool of K-format super-blocks: random quants and sub-block scales; d (and dmin) set so that
 * |w| stays within about 0.02 */
static void fill_kquant(qf_type t, uint8_t *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)(qf_xorshift64s(&rs) >> 56);
    const size_t bb = qf_type_block_bytes(t);
    for (size_t b = 0; b + bb <= bytes; b += bb) {
        uint8_t *k = p + b; /* the blocks are byte-aligned in the pool: the scales are copied in */
        if (t == QF_TYPE_Q6_K) { /* d * sc * (q - 32), |sc| <= 128, |q - 32| <= 32: d ~ 5e-6 */
            const uint16_t h = qf_f32_to_f16(5e-6f);
            memcpy(k + offsetof(block_q6_K, d), &h, 2);
        } else { /* d * sc * q - dmin * m, sc, m <= 63, q <= 15 (31 for q5_k); d and dmin lead both types */
            const uint16_t h = qf_f32_to_f16(t == QF_TYPE_Q5_K ? 1e-5f : 2e-5f), hm = qf_f32_to_f16(1e-4f);
            memcpy(k + offsetof(block_q4_K, d), &h, 2), memcpy(k + offsetof(block_q4_K, dmin), &hm, 2);
        }
    }
}

/* llama.cpp's Q4_K_M rule for the tensors that get more bits (attn_v, ffn_down) */
static bool more_bits(int il, int L) { return il < L / 8 || il >= 7 * L / 8 || (il - L / 8) % 3 == 2; }

static int die(const char *msg) {
    fprintf(stderr, "gen_model_shapes: %s\n", msg);
    return 1;
}

int main(int argc, char **argv) {
    const char *sname = "llama3-8b", *tname = "f16", *out = NULL, *vocab = "assets/models/qforge-demo-11m-f16.gguf";
    int layers = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) sname = argv[++i];
        else if (!strcmp(argv[i], "--type") && i + 1 < argc) tname = argv[++i];
        else if (!strcmp(argv[i], "--vocab-from") && i + 1 < argc) vocab = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else {
            fprintf(stderr, "usage: %s --shape llama3-8b|llama3.2-1b|qwen2.5-0.5b|tiny-hd8|tiny-qwen2|test-d2048 --type f16|q4_0|q8_0|f32|q4_k|q5_k|q6_k|q4_k_m [--vocab-from GGUF] "
                            "[--layers N] -o OUT.gguf\n", argv[0]);
            return 2;
        }
    }
    const shape *S = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, sname)) S = &shapes[i];
    qf_type wt;
    const bool mix = !strcmp(tname, "q4_k_m");
    if (!S) return die("unknown --shape");
    if (mix) wt = QF_TYPE_Q4_K;
    else if (!qf_type_from_name(tname, &wt) || (wt != QF_TYPE_F16 && wt != QF_TYPE_Q4_0 && wt != QF_TYPE_Q8_0 &&
                                                wt != QF_TYPE_F32 && wt != QF_TYPE_Q4_K && wt != QF_TYPE_Q5_K &&
                                                wt != QF_TYPE_Q6_K))
        return die("--type must be f16, q4_0, q8_0, f32, q4_k, q5_k, q6_k or q4_k_m");
    const bool kq = qf_type_block_elems(wt) == 256;
    if (kq && (S->n_embd % 256 || S->n_ff % 256 || (int64_t)S->n_head * S->head_dim % 256))
        return die("the K formats need n_embd, n_ff and n_head * head_dim multiples of 256");
    if (!out) return die("-o OUT.gguf is required");
    int L = layers > 0 ? layers : S->n_layer;
    qf_error err = {0};
    qf_gguf *src = qf_gguf_open(vocab, &err);
    if (!src) return die(err.msg);

    qf_gguf_writer *w = qf_gguf_writer_new();
    char key[160], buf[160];
    qf_gguf_writer_set_str(w, "general.architecture", S->arch);
    qf_gguf_writer_set_str(w, "general.name", S->gname);
#define AK(suffix) (snprintf(key, sizeof key, "%s.%s", S->arch, suffix), key)
    qf_gguf_writer_set_u32(w, AK("block_count"), (uint32_t)L);
    qf_gguf_writer_set_u32(w, AK("context_length"), 8192);
    qf_gguf_writer_set_u32(w, AK("embedding_length"), (uint32_t)S->n_embd);
    qf_gguf_writer_set_u32(w, AK("feed_forward_length"), (uint32_t)S->n_ff);
    qf_gguf_writer_set_u32(w, AK("attention.head_count"), (uint32_t)S->n_head);
    qf_gguf_writer_set_u32(w, AK("attention.head_count_kv"), (uint32_t)S->n_head_kv);
    qf_gguf_writer_set_u32(w, AK("attention.key_length"), (uint32_t)S->head_dim);
    qf_gguf_writer_set_u32(w, AK("attention.value_length"), (uint32_t)S->head_dim);
    qf_gguf_writer_set_u32(w, AK("rope.dimension_count"), (uint32_t)S->head_dim);
    qf_gguf_writer_set_f32(w, AK("rope.freq_base"), S->rope_base);
    qf_gguf_writer_set_f32(w, AK("attention.layer_norm_rms_epsilon"), 1e-5f);
    for (uint64_t i = 0; i < qf_gguf_n_kv(src); i++) {
        const qf_gguf_kv *kv = qf_gguf_kv_at(src, i);
        if (kv->key.len >= sizeof buf || kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10) != 0) continue;
        memcpy(buf, kv->key.ptr, kv->key.len);
        buf[kv->key.len] = 0;
        qf_gguf_value v = kv->value;
        uint8_t *padded = NULL;
        /* the per-token arrays are padded to the model's vocabulary with reserved control tokens
         * (type 3, score 0), so that llama.cpp, which wants one token per embedding row, loads the
         * same file; qforge reads the tokenizer as a prefix of the vocabulary either way */
        bool per_token = !strcmp(buf, "tokenizer.ggml.tokens") || !strcmp(buf, "tokenizer.ggml.token_type") ||
                         !strcmp(buf, "tokenizer.ggml.scores");
        if (per_token && v.type == QF_GGUF_ARRAY && v.v.arr.count < (uint64_t)S->n_vocab) {
            uint64_t extra = (uint64_t)S->n_vocab - v.v.arr.count;
            size_t cap = v.v.arr.nbytes + (size_t)extra * 32, off = v.v.arr.nbytes;
            if (!(padded = malloc(cap))) return die("out of memory");
            memcpy(padded, v.v.arr.data, v.v.arr.nbytes);
            for (uint64_t k = 0; k < extra; k++) {
                if (v.v.arr.elem_type == QF_GGUF_STRING) {
                    char name[32];
                    uint64_t len = (uint64_t)snprintf(name, sizeof name, "<|reserved_%llu|>",
                                                      (unsigned long long)(v.v.arr.count + k));
                    memcpy(padded + off, &len, 8);
                    memcpy(padded + off + 8, name, len);
                    off += 8 + len;
                } else if (v.v.arr.elem_type == QF_GGUF_INT32) {
                    int32_t ty = 3;
                    memcpy(padded + off, &ty, 4);
                    off += 4;
                } else if (v.v.arr.elem_type == QF_GGUF_FLOAT32) {
                    float sc = 0.0f;
                    memcpy(padded + off, &sc, 4);
                    off += 4;
                } else {
                    break;
                }
            }
            if (off > v.v.arr.nbytes) {
                v.v.arr.data = padded;
                v.v.arr.nbytes = off;
                v.v.arr.count = (uint64_t)S->n_vocab;
            }
        }
        qf_status vst = qf_gguf_writer_set_value(w, buf, src, &v);
        free(padded);
        if (vst) return die("copying tokenizer metadata failed");
    }

    const int64_t D = S->n_embd, Dq = (int64_t)S->n_head * S->head_dim, Dkv = (int64_t)S->n_head_kv * S->head_dim,
                  F = S->n_ff, V = S->n_vocab;
    int64_t maxel = V * D;
    if (F * D > maxel) maxel = F * D;
    size_t pool_bytes = qf_row_bytes(wt, maxel);
    uint8_t *pool = malloc(pool_bytes);
    /* q4_k_m: the q6_k pool of the output and the tensors that get more bits */
    uint8_t *pool6 = mix ? malloc(qf_row_bytes(QF_TYPE_Q6_K, maxel)) : NULL;
    if (mix && !pool6) return die("out of memory");
    if (mix) fill_kquant(QF_TYPE_Q6_K, pool6, qf_row_bytes(QF_TYPE_Q6_K, maxel));
    float *ones = malloc((size_t)(F > V ? F : V) * 4), *tmp = malloc(4096 * 4);
    if (!pool || !ones || !tmp) return die("out of memory");
    for (int64_t i = 0; i < (F > V ? F : V); i++) ones[i] = 1.0f;
    size_t chunk_bytes = qf_row_bytes(wt, 4096);
    if (kq) fill_kquant(wt, pool, pool_bytes);
    else
        for (int64_t off = 0; off < maxel; off += 4096) {
            for (int j = 0; j < 4096; j++) tmp[j] = 0.02f * grand();
            qf_quantize_row(wt, tmp, pool + (size_t)(off / 4096) * chunk_bytes, 4096);
        }
    float *bias = malloc((size_t)Dq * 4);
    for (int64_t i = 0; i < Dq; i++) bias[i] = 0.01f * grand();

    qf_status st = QF_OK;
#define MATT(nm, ne0, ne1, T, P)                                                                           \
    do {                                                                                                   \
        int64_t ne_[2] = {(ne0), (ne1)};                                                                   \
        st = st ? st : qf_gguf_writer_add_tensor(w, nm, T, 2, ne_, P, qf_row_bytes(T, (ne0)) * (ne1), &err); \
    } while (0)
#define MAT(nm, ne0, ne1) MATT(nm, ne0, ne1, wt, pool)
    /* q4_k_m's q6_k tensors */
#define MAT6(nm, ne0, ne1, six)                                             \
    do {                                                                    \
        if (six) MATT(nm, ne0, ne1, QF_TYPE_Q6_K, pool6);                   \
        else MAT(nm, ne0, ne1);                                             \
    } while (0)
#define VEC(nm, n, data)                                                                                       \
    do {                                                                                                       \
        int64_t ne_[1] = {(n)};                                                                                \
        st = st ? st : qf_gguf_writer_add_tensor(w, nm, QF_TYPE_F32, 1, ne_, data, (uint64_t)(n) * 4, &err);   \
    } while (0)
    MAT("token_embd.weight", D, V);
    VEC("output_norm.weight", D, ones);
    if (!S->tied) MAT6("output.weight", D, V, mix);
    char nm[96];
    for (int il = 0; il < L; il++) {
#define N(s) (snprintf(nm, sizeof nm, "blk.%d.%s", il, s), nm)
        VEC(N("attn_norm.weight"), D, ones);
        MAT(N("attn_q.weight"), D, Dq);
        MAT(N("attn_k.weight"), D, Dkv);
        MAT6(N("attn_v.weight"), D, Dkv, mix && more_bits(il, L));
        if (S->bias) {
            VEC(N("attn_q.bias"), Dq, bias);
            VEC(N("attn_k.bias"), Dkv, bias);
            VEC(N("attn_v.bias"), Dkv, bias);
        }
        MAT(N("attn_output.weight"), Dq, D);
        VEC(N("ffn_norm.weight"), D, ones);
        MAT(N("ffn_gate.weight"), D, F);
        MAT(N("ffn_up.weight"), D, F);
        MAT6(N("ffn_down.weight"), F, D, mix && more_bits(il, L));
    }
    if (!st) st = qf_gguf_writer_write(w, out, &err);
    if (st) return die(err.msg);
    printf("%s: %s %s, %d layers, vocab %lld\n", out, S->name, tname, L, (long long)V);
    qf_gguf_writer_free(w);
    qf_gguf_close(src);
    free(pool), free(pool6), free(ones), free(tmp), free(bias);
    return 0;
}
