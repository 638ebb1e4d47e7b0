/* bench_gpu.c: prefill throughput of the CUDA backend next to the H200 roofline.
 *
 *   build/bench/bench_gpu MODEL.gguf [--corpus TEXT] [--chunks 4] [-c 512] [--kv f16] [--kv-v MODE]
 *       [--device cuda|cpu] (--kv: the cache mode of K and V, --kv-v: V's if it differs)
 *       [--prefill-only]   (with QF_CUDA_PROFILE=1 the backend prints GPU time per stage at exit;
 *                           every QF_CUDA_* knob of the CLI is read here too, see tools/cuda_env.h)
 *       [--decode-steps N] [--decode-pos P] (decode: N single-token steps after a P-token prefill)
 *       [--sampler]        (decode: also the step qforge generate takes, the sampler three ways)
 *       [--int8 LAYOUT]    (bind a synthetic kv-int8 payload, every scale 0.05, LAYOUT static |
 *                           static-rot | token-rot | token | ec-rot: the speed of an int8 KV cache; the
 *                           numbers it gives are not a model's)
 *       [--gemm]           (cuBLAS f16 GEMM rate for the model's shapes at M = -c: f32 and f16 output,
 *                           f32 accumulating into C, and f32 with W not in L2)
 *
 * Three measurements on chunks of -c tokens (BOS + text tokens, as the PPL pass feeds them):
 *   prefill  qf_decode of the whole chunk, logits of the last token only;
 *   ppl      qf_decode of the whole chunk with every token's logits copied back (what
 *            qf_perplexity asks for), and the full qf_perplexity pass (tokenize, decode, score);
 *   decode   single-token steps after a half-chunk prefill (tokens/s); on the GPU with --sampler
 *            also the step qforge generate takes (the row copied and drawn by the full sort, as before
 *            session 38, or by qf_sample, against the row reduced on the device: decode_topk),
 *            greedy and with the CLI's default sampling;
 *   gpu ppl  the same PPL pass with the log-softmax on the GPU (qf_decode_nll: no logits
 *            leave the device), its PPL compared with qf_perplexity's.
 * Roofline per chunk: FLOPs = 2 * (matmul params) * tokens + 2 * D * n_vocab * logit rows
 * + attention (4 * n_head * head_dim * causal pairs per layer); bytes = the weights as
 * stored, read once per chunk. Time bound = max(FLOPs / 989 TFLOP/s, bytes / 4.8 TB/s)
 * (H200 dense f16/bf16 and HBM3e datasheet peaks); the fraction printed is bound / measured. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qforge/artifact_bind.h"
#include "qforge/model.h"
#include "qforge/ppl.h"
#include "qforge/tokenizer.h"
#include "../tools/cuda_env.h"
#include "engine/gpu.h"
#include "engine/sample.h"
#include "kernels/cuda/cuda_ops.h"
#include "util/util.h"

#define PEAK_FLOPS 989e12
#define PEAK_BW 4.8e12

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of v[0..n) (sorts v); the mean of the two middle values for even n */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static size_t wbytes(const qf_weight *w) { return w->data ? w->row_bytes * (size_t)w->ne1 : 0; }
static double wparams(const qf_weight *w) { return w->data ? (double)w->ne0 * w->ne1 : 0; }

int main(int argc, char **argv) {
    const char *model = NULL, *corpus = NULL, *kvs = "f16", *kvvs = NULL, *devs = "cuda", *int8_layout = NULL;
    int n_ctx = 512, chunks = 4, prefill_only = 0, gemm = 0, dsteps = 64, dpos = -1, decode_only = 0, sampler = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--corpus") && i + 1 < argc) corpus = argv[++i];
        else if (!strcmp(argv[i], "--chunks") && i + 1 < argc) chunks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) n_ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) kvs = argv[++i];
        else if (!strcmp(argv[i], "--kv-v") && i + 1 < argc) kvvs = argv[++i]; /* V's mode (default: --kv's) */
        else if (!strcmp(argv[i], "--int8") && i + 1 < argc) int8_layout = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) devs = argv[++i];
        else if (!strcmp(argv[i], "--prefill-only")) prefill_only = 1; /* e.g. with QF_CUDA_PROFILE=1 */
        else if (!strcmp(argv[i], "--gemm")) gemm = 1;
        else if (!strcmp(argv[i], "--sampler")) sampler = 1; /* decode: also the generate step three ways */
        else if (!strcmp(argv[i], "--decode-only")) decode_only = 1; /* with QF_CUDA_PROFILE=1: decode stages alone */
        else if (!strcmp(argv[i], "--decode-steps") && i + 1 < argc) dsteps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode-pos") && i + 1 < argc) dpos = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !model) model = argv[i];
        else {
            fprintf(stderr, "usage: %s MODEL.gguf [--corpus TEXT] [--chunks N] [-c N] [--kv f16] [--kv-v MODE] [--device cuda|cpu]\n", argv[0]);
            return 2;
        }
    }
    if (!model || n_ctx < 8 || chunks < 1) {
        fprintf(stderr, "bench_gpu: a model path is required\n");
        return 2;
    }
    qf_error err = {0};
    double t0 = now();
    qf_model *m = qf_model_load(model, &err);
    if (!m) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    const qf_hparams *hp = qf_model_hparams(m);
    qf_context_params p = qf_context_default_params();
    p.n_ctx = n_ctx;
    cli_cuda_env(&p.cuda); /* the CLI's QF_CUDA_* defaults */
    {
        const char *v;
        if ((v = getenv("QF_KV_ROT")) && !strcmp(v, "hadamard")) p.kv_rot = QF_KV_ROT_HADAMARD;
    }
    if (!qf_kv_mode_from_name(kvs, &p.kv_k) || !qf_kv_mode_from_name(kvvs ? kvvs : kvs, &p.kv_v) ||
        !qf_device_from_name(devs, &p.device)) {
        fprintf(stderr, "bench_gpu: bad --kv, --kv-v or --device\n");
        return 2;
    }
    qf_context *c = qf_context_new(m, &p, &err);
    if (!c) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    if (int8_layout) { /* a synthetic kv-int8 payload: per-(layer, kv head) scales of 0.05 */
        qf_payload pl = {0};
        const int L = hp->n_layer, H = hp->n_head_kv;
        float *sc = malloc(sizeof(float) * (size_t)L * H);
        for (int i = 0; i < L * H; i++) sc[i] = 0.05f;
        int64_t shape[2] = {L, H};
        qf_status st = qf_payload_add_f32(&pl, "k_scale", sc, 2, shape, &err);
        if (!st) st = qf_payload_add_f32(&pl, "v_scale", sc, 2, shape, &err);
        if (!st) st = qf_payload_add_string(&pl, "k_layout", int8_layout, &err);
        if (!st) st = qf_payload_add_string(&pl, "v_layout", int8_layout, &err);
        if (!st) st = qf_context_bind_payload(c, QF_ARTIFACT_KV_INT8, &pl, &err);
        qf_payload_free(&pl);
        free(sc);
        if (st) {
            fprintf(stderr, "bench_gpu: --int8 %s: %s\n", int8_layout, err.msg);
            return 1;
        }
        printf("kv-int8 (synthetic payload, layout %s) bound\n", int8_layout);
    }
    double t_load = now() - t0;

    /* weights and matmul parameters */
    double mm_params = 0, bytes = wbytes(qf_model_output(m)) + wbytes(qf_model_output_norm(m));
    if (qf_model_output(m)->data != qf_model_tok_embd(m)->data) bytes += 0; /* embeddings: rows gathered, not streamed */
    for (int il = 0; il < hp->n_layer; il++) {
        const qf_layer_weights *L = qf_model_layer(m, il);
        const qf_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) mm_params += wparams(ws[i]), bytes += wbytes(ws[i]);
    }
    const double out_params = wparams(qf_model_output(m));

    /* tokens: the corpus if given, else a fixed pseudo-random id sequence */
    int32_t *toks = malloc((size_t)n_ctx * chunks * sizeof(int32_t));
    int64_t nt = 0;
    char *text = NULL;
    size_t tlen = 0;
    if (corpus) {
        FILE *f = fopen(corpus, "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            long n = ftell(f);
            fseek(f, 0, SEEK_SET);
            text = n > 0 ? malloc((size_t)n) : NULL;
            if (text) tlen = fread(text, 1, (size_t)n, f);
            fclose(f);
        }
        int32_t *all = NULL;
        size_t na = 0;
        if (text && qf_tokenize(qf_model_tokenizer(m), text, tlen, true, false, &all, &na, &err) == QF_OK) {
            nt = (int64_t)na < (int64_t)n_ctx * chunks ? (int64_t)na : (int64_t)n_ctx * chunks;
            memcpy(toks, all, (size_t)nt * sizeof(int32_t));
        }
        free(all);
    }
    uint64_t r = 12345;
    for (int64_t i = nt; i < (int64_t)n_ctx * chunks; i++) {
        toks[i] = (int32_t)((qf_splitmix64(&r) >> 33) % (uint64_t)(hp->n_vocab < 4096 ? hp->n_vocab : 4096));
    }

    float *logits = malloc((size_t)n_ctx * hp->n_vocab * sizeof(float));
    if (!logits) return 1;
    double attn_pairs = (double)n_ctx * (n_ctx + 1) / 2;
    double attn_flops = 4.0 * hp->n_head * hp->head_dim * attn_pairs * hp->n_layer;
    double fl_prefill = 2 * mm_params * n_ctx + 2 * out_params + attn_flops;
    double fl_all = 2 * mm_params * n_ctx + 2 * out_params * n_ctx + attn_flops;
    double tb_prefill = fmax(fl_prefill / PEAK_FLOPS, bytes / PEAK_BW), tb_all = fmax(fl_all / PEAK_FLOPS, bytes / PEAK_BW);

    printf("model %s (%s): %d layers, n_embd %d, heads %d/%d x %d, n_ff %d, vocab %d; %.3f G matmul params, %.2f GB weights streamed per chunk\n",
           hp->name, model, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, hp->n_vocab,
           (mm_params + out_params) / 1e9, bytes / 1e9);
    printf("device %s, kv %s%s%s, -c %d, %d chunks; load+upload %.1f s\n", qf_device_name(qf_context_device(c)), kvs,
           kvvs ? " / v " : "", kvvs ? kvvs : "", n_ctx,
           chunks, t_load);
    /* warm-up (cuBLAS heuristics, first-touch) */
    if (!decode_only && qf_decode(c, toks, n_ctx, 0, logits, n_ctx - 1, &err)) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    qf_cuda_info ci;
    if (qf_context_gpu_info(c, &ci)) {
        printf("GPU memory: weights %.2f GB, f16 cache of quantized weights %.2f GB, kv %.2f GB, scratch %.2f GB\n",
               ci.weight_bytes / 1e9, ci.f16_cache_bytes / 1e9, ci.kv_bytes / 1e9, ci.scratch_bytes / 1e9);
    }
    if (gemm && qf_context_device(c) == QF_DEVICE_CUDA) {
        const int D = hp->n_embd, Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim, F = hp->n_ff;
        struct { const char *name; int N, K; } sh[] = {{"q/o", Dq, D}, {"k/v", Dkv, D}, {"qkv fused", Dq + 2 * Dkv, D},
                                                       {"gate/up", F, D}, {"gate+up fused", 2 * F, D}, {"down", D, F},
                                                       {"output", hp->n_vocab, D}};
        for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
            double ms32 = 0, ms16 = 0, msacc = 0, mscold = 0;
            if (qf_cuda_bench_gemm(n_ctx, sh[i].N, sh[i].K, 0, 20, &ms32, &err) ||
                qf_cuda_bench_gemm(n_ctx, sh[i].N, sh[i].K, 1, 20, &ms16, &err) ||
                qf_cuda_bench_gemm(n_ctx, sh[i].N, sh[i].K, 2, 20, &msacc, &err) ||
                qf_cuda_bench_gemm(n_ctx, sh[i].N, sh[i].K, 4, 20, &mscold, &err)) {
                fprintf(stderr, "bench_gpu: gemm: %s\n", err.msg);
                break;
            }
            double fl = 2.0 * n_ctx * sh[i].N * sh[i].K;
            printf("gemm %-14s M %d N %6d K %6d: f32 out %.3f ms %.0f TFLOP/s; f16 out %.3f ms %.0f; f32 +=C %.3f ms %.0f; f32 cold L2 %.3f ms %.0f\n",
                   sh[i].name, n_ctx, sh[i].N, sh[i].K, ms32, fl / ms32 / 1e9, ms16, fl / ms16 / 1e9, msacc,
                   fl / msacc / 1e9, mscold, fl / mscold / 1e9);
        }
    }

    double best_p = 1e30, best_a = 1e30, sum_p = 0, sum_a = 0;
    double *tp = calloc((size_t)chunks, sizeof(double)), *ta = calloc((size_t)chunks, sizeof(double));
    if (!tp || !ta) {
        fprintf(stderr, "bench_gpu: out of memory\n");
        return 1;
    }
    for (int ch = 0; ch < chunks && !decode_only; ch++) {
        const int32_t *tk = toks + (size_t)ch * n_ctx;
        double a = now();
        if (qf_decode(c, tk, n_ctx, 0, logits, n_ctx - 1, &err)) break;
        double b = now();
        if (qf_decode(c, tk, n_ctx, 0, logits, 0, &err)) break;
        double e = now();
        best_p = fmin(best_p, b - a), best_a = fmin(best_a, e - b);
        tp[ch] = b - a, ta[ch] = e - b;
        sum_p += b - a, sum_a += e - b;
    }
    if (err.code) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    const double med_p = median(tp, chunks), med_a = median(ta, chunks);
    free(tp), free(ta);
    /* the first % uses the best chunk, the second the median chunk */
    if (!decode_only) {
    printf("prefill (last logits):  %8.0f tok/s mean, best %.2f ms/chunk, median %.2f of %d; %.1f TFLOP/s (best); roofline "
           "bound %.2f ms -> %.1f%% of roofline (best chunk), %.1f%% (median chunk)\n",
           n_ctx * chunks / sum_p, best_p * 1e3, med_p * 1e3, chunks, fl_prefill / best_p / 1e12, tb_prefill * 1e3,
           100 * tb_prefill / best_p, 100 * tb_prefill / med_p);
    printf("prefill (all logits):   %8.0f tok/s mean, best %.2f ms/chunk, median %.2f of %d; %.1f TFLOP/s (best); roofline "
           "bound %.2f ms -> %.1f%% of roofline (best chunk), %.1f%% (median chunk)\n",
           n_ctx * chunks / sum_a, best_a * 1e3, med_a * 1e3, chunks, fl_all / best_a / 1e12, tb_all * 1e3,
           100 * tb_all / best_a, 100 * tb_all / med_a);

    }
    if (prefill_only) {
        free(text), free(toks), free(logits);
        qf_context_free(c);
        qf_model_free(m);
        return 0;
    }
    /* decode: prefill half a chunk (or --decode-pos), then single tokens */
    int half = dpos >= 1 && dpos < n_ctx ? dpos : n_ctx / 2, steps = n_ctx - half < dsteps ? n_ctx - half : dsteps;
    /* one untimed step at each end of the range first: each captures the CUDA graph of its
     * band of positions (short caches' attention runs another kernel, so a context longer than
     * that has two graphs); the timed steps rewrite both rows */
    if (qf_decode(c, toks, half, 0, NULL, half, &err) || qf_decode(c, toks + half, 1, half, logits, 0, &err) ||
        (steps > 1 && qf_decode(c, toks + half + steps - 1, 1, half + steps - 1, logits, 0, &err))) {
        fprintf(stderr, "bench_gpu: decode: %s\n", err.msg);
        return 1;
    }
    double a = now();
    for (int i = 0; i < steps; i++)
        if (qf_decode(c, toks + half + i, 1, half + i, logits, 0, &err)) {
            /* a failed step must not print a rate (it returns at once: the rate would be absurd) */
            fprintf(stderr, "bench_gpu: decode step %d: %s\n", i, err.msg);
            return 1;
        }
    double dt = now() - a;
    qf_cuda_info gi = {0};
    const bool on_gpu = qf_context_gpu_info(c, &gi);
    printf("decode (1 token/step):  %8.1f tok/s at positions %d..%d; bandwidth bound %.0f tok/s -> %.1f%% of roofline",
           steps / dt, half, half + steps - 1, PEAK_BW / bytes, 100 * (steps / dt) / (PEAK_BW / bytes));
    if (on_gpu)
        printf("; %ld of the %d one-token steps replayed a CUDA graph (%ld nodes)", gi.graph_steps, steps + 1 + (steps > 1),
               gi.graph_nodes);
    printf("\n");
    if (on_gpu && sampler) {
        /* the step qf_generate takes, the same tokens fed (the drawn one is not): the row copied
         * and drawn from on the host by the full sort (qf_sample_ref, the sampler before session
         * 38) and by qf_sample, against the logits reduced on the device (qf_gpu_decode_topk,
         * qf_generate's route since) */
        const qf_sampler_params sps[2] = {{.temp = 0.0f}, {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 42}};
        for (int si = 0; si < 2; si++) {
            qf_sampler smp;
            if (qf_sampler_init(&smp, &sps[si], hp->n_vocab)) return 1;
            double r3[3];
            long sink = 0;
            for (int how = 0; how < 3; how++) {
                const int ns = how == 0 && si ? (steps < 16 ? steps : 16) : steps; /* the full sort: 30 ms a token */
                const double ts = now();
                for (int i = 0; i < ns; i++) {
                    const int32_t tk = toks[half + i];
                    if (how < 2) {
                        if (qf_decode(c, &tk, 1, half + i, logits, 0, &err)) return fprintf(stderr, "bench_gpu: %s\n", err.msg), 1;
                        sink += how == 0 ? qf_sample_ref(&smp, logits) : qf_sample(&smp, logits);
                    } else {
                        qf_gpu_topk tr;
                        if (qf_gpu_decode_topk(c, tk, half + i, sps[si].temp, sps[si].top_k, &tr, &err))
                            return fprintf(stderr, "bench_gpu: %s\n", err.msg), 1;
                        sink += sps[si].temp <= 0 ? tr.argmax
                                                  : qf_sample_candidates(&smp, tr.id, tr.logit, tr.n, tr.lmax, tr.sum);
                    }
                }
                r3[how] = ns / (now() - ts);
            }
            printf("generate step (%s): %8.1f tok/s row copied + full sort (before), %8.1f row copied + qf_sample, "
                   "%8.1f reduced on the device (qf_generate), %.3fx the decode step [%ld]\n",
                   si ? "temp 0.8 top-k 40 top-p 0.95" : "greedy", r3[0], r3[1], r3[2], r3[2] / (steps / dt), sink % 7);
            qf_sampler_free(&smp);
        }
    }

    if (text) {
        qf_ppl_params pp = qf_ppl_default_params();
        pp.n_ctx = n_ctx;
        pp.n_chunks = chunks;
        qf_ppl_result res;
        if (qf_perplexity_text(c, text, tlen, &pp, &res, &err) == QF_OK)
            printf("PPL pass (qf_perplexity, %d chunks): PPL %.4f +/- %.4f, %.0f tok/s end to end (includes CPU log-softmax over %d logits/token)\n",
                   res.n_chunks, res.ppl, res.ppl_err, res.tokens_per_sec, hp->n_vocab);
        else
            fprintf(stderr, "bench_gpu: ppl: %s\n", err.msg);
        /* the same pass, scored on the GPU: ppl.c's chunking (BOS first, second half scored) */
        int32_t *ids = NULL;
        size_t nids = 0;
        const qf_tokenizer *tkz = qf_model_tokenizer(m);
        if (qf_context_device(c) == QF_DEVICE_CUDA && qf_tokenize(tkz, text, tlen, qf_tokenizer_add_bos(tkz), false, &ids, &nids, &err) == QF_OK &&
            (int64_t)nids >= 2 * (int64_t)n_ctx) {
            int n_chunk = (int)(nids / n_ctx) < chunks ? (int)(nids / n_ctx) : chunks;
            const int first = n_ctx / 2, n_score = n_ctx - 1 - first;
            const bool add_bos = qf_tokenizer_add_bos(tkz) && qf_tokenizer_bos(tkz) >= 0;
            int32_t *chunk = malloc((size_t)n_ctx * sizeof(int32_t));
            double *nll = malloc((size_t)n_ctx * sizeof(double)), sum = 0;
            int64_t count = 0;
            double t0p = now();
            for (int i = 0; i < n_chunk && chunk && nll; i++) {
                memcpy(chunk, ids + (size_t)i * n_ctx, (size_t)n_ctx * sizeof(int32_t));
                if (add_bos) chunk[0] = qf_tokenizer_bos(tkz);
                /* rows first .. n_ctx-2 predict tokens first+1 .. n_ctx-1; the last row is not scored */
                if (qf_decode_nll(c, chunk, n_ctx - 1, 0, first, ids + (size_t)i * n_ctx + first + 1, nll, &err)) {
                    fprintf(stderr, "bench_gpu: gpu ppl: %s\n", err.msg);
                    break;
                }
                for (int k = 0; k < n_score; k++) sum += nll[k];
                count += n_score;
            }
            double dtp = now() - t0p;
            if (count == (int64_t)n_chunk * n_score) {
                double ppl = exp(sum / (double)count);
                printf("PPL pass, GPU log-softmax (qf_decode_nll, %d chunks): PPL %.4f (rel. diff to qf_perplexity %.2e), %.0f tok/s\n",
                       n_chunk, ppl, fabs(ppl - res.ppl) / res.ppl, (double)n_chunk * n_ctx / dtp);
            }
            free(chunk), free(nll);
        }
        free(ids);
    }
    free(text), free(toks), free(logits);
    qf_context_free(c);
    qf_model_free(m);
    return 0;
}
