/* gemm.c: the integer prefill GEMM for Q8_0 / Q4_0 weights: activation quantization, panel
 * packing, the scalar oracle and the run-time dispatch to the AVX-512 VNNI kernel
 * (gemm_avx512.c). The math is in gemm.h. */
#include "kernels/gemm.h"

#include <cpuid.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant_blocks.h"
#include "util/util.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

bool qf_gemm_q8_type(qf_type t) { return t == QF_TYPE_Q8_0 || t == QF_TYPE_Q4_0 || t == QF_TYPE_Q5_0; }

/* the unsigned quant u of element j of a Q5_0 block (value u - 16) */
static inline int q5_0_u(const block_q5_0 *b, int j) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    int nib = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
    return nib | (int)(((qh >> j) & 1) << 4);
}

/* the activation offset for weight type wt: Q8_0 is stored as w + 128, Q4_0 as q (value q - 8),
 * Q5_0 as q (value q - 16) */
static int32_t q8_offset(qf_type wt) { return wt == QF_TYPE_Q8_0 ? 128 : wt == QF_TYPE_Q4_0 ? 8 : 16; }

/* AVX-512 F, BW, VL and VNNI, with the OS saving the zmm state (XCR0 bits 1, 2, 5, 6, 7). */
static bool cpu_has_avx512vnni_raw(void) {
    static _Atomic int cached = -1;
    int v = cached;
    if (v < 0) {
        unsigned a, b, c, d;
        v = 0;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27))) { /* OSXSAVE */
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            (void)hi;
            if ((lo & 0xE6) == 0xE6 && __get_cpuid_count(7, 0, &a, &b, &c, &d))
                v = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31)) && (c & (1u << 11));
        }
        cached = v;
    }
    return v;
}

/* AVX-VNNI (cpuid leaf 7 sub-leaf 1, eax bit 4): vpdpbusd on ymm without AVX-512 */
static bool cpu_has_avxvnni_raw(void) {
    static _Atomic int cached = -1;
    int v = cached;
    if (v < 0) {
        unsigned a = 0, b, c, d;
        v = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
        cached = v;
    }
    return v;
}

static _Atomic int isa_cap = -1; /* -1: not read yet */

void qf_gemm_cap_isa(qf_gemm_isa cap) { isa_cap = cap; }

/* QF_GEMM_ISA=avx2|avxvnni|avx512 in the environment caps the level for the whole process (to
 * measure or test the lower kernels on a CPU that has the higher ones) */
static int isa_cap_get(void) {
    int c = isa_cap;
    if (c < 0) {
        const char *e = getenv("QF_GEMM_ISA");
        c = !e ? QF_GEMM_ISA_AVX512 : !strcmp(e, "avx2") ? QF_GEMM_ISA_AVX2 : !strcmp(e, "avxvnni") ? QF_GEMM_ISA_AVXVNNI
                                                                                                     : QF_GEMM_ISA_AVX512;
        isa_cap = c;
    }
    return c;
}

qf_gemm_isa qf_gemm_isa_get(void) {
    const int cap = isa_cap_get();
    if (!qf_quant_has_avx2()) return QF_GEMM_ISA_NONE; /* also under qf_quant_force_scalar */
    qf_gemm_isa best = cpu_has_avx512vnni_raw() ? QF_GEMM_ISA_AVX512 : cpu_has_avxvnni_raw() ? QF_GEMM_ISA_AVXVNNI
                                                                                             : QF_GEMM_ISA_AVX2;
    if (best == QF_GEMM_ISA_AVX512 && cap == QF_GEMM_ISA_AVXVNNI && !cpu_has_avxvnni_raw()) best = QF_GEMM_ISA_AVX2;
    return best < (qf_gemm_isa)cap ? best : (qf_gemm_isa)cap;
}

/* the AVX-512 kernels (f16 GEMM, K-quant GEMM, the VNNI decode dot) run only at the AVX512 level */
static bool cpu_has_avx512vnni(void) { return qf_gemm_isa_get() == QF_GEMM_ISA_AVX512; }

bool qf_gemm_q8_supported(qf_type t) { return qf_gemm_q8_type(t) && qf_gemm_isa_get() != QF_GEMM_ISA_NONE; }

size_t qf_gemm_act_stride(int64_t K) {
    size_t s = (size_t)K + (size_t)(K / 32) * 8;
    return (s + 63) & ~(size_t)63;
}

void qf_gemm_quantize_act(qf_type wt, const float *x, int64_t K, int t0, int t1, uint8_t *act, void *tmp) {
    if (qf_gemm_q8_type(wt) && cpu_has_avx512vnni()) {
        qf_gemm_quantize_act_avx512(wt, x, K, t0, t1, act);
        return;
    }
    const int64_t nb = K / 32;
    const int32_t off = q8_offset(wt);
    const size_t stride = qf_gemm_act_stride(K);
    block_q8_0 *blk = tmp;
    for (int t = t0; t < t1; t++) {
        qf_quantize_row(QF_TYPE_Q8_0, x + (size_t)t * K, blk, K);
        uint8_t *row = act + (size_t)t * stride;
        float *d = (float *)(void *)(row + K);
        int32_t *corr = (int32_t *)(void *)(row + K + nb * 4);
        for (int64_t b = 0; b < nb; b++) {
            memcpy(row + b * 32, blk[b].qs, 32);
            int32_t s = 0;
            for (int j = 0; j < 32; j++) s += blk[b].qs[j];
            d[b] = qf_f16_to_f32(blk[b].d);
            corr[b] = -off * s;
        }
    }
}

/* bytes of one block of a packed panel (QF_GEMM_NR rows) */
static size_t panel_block_bytes(qf_type wt) { return wt == QF_TYPE_Q4_0 ? 4 * QF_GEMM_NR * 4 : 8 * QF_GEMM_NR * 4; }

size_t qf_gemm_panel_bytes(qf_type wt, int64_t K) {
    return (size_t)(K / 32) * (panel_block_bytes(wt) + QF_GEMM_NR * sizeof(float));
}

size_t qf_gemm_scratch_bytes(qf_type wt, int64_t K, int64_t rows) {
    return (size_t)((rows + QF_GEMM_NR - 1) / QF_GEMM_NR) * qf_gemm_panel_bytes(wt, K);
}

/* Panel of rows [r, r + nrows) (nrows <= QF_GEMM_NR; missing rows are zero with scale 0):
 * for each block b, [group][row][4 bytes] unsigned quants, then all scales [b][row] as f32.
 * Q8_0: 8 groups of 4 elements, u = w ^ 0x80. Q4_0: 4 groups of 4 raw qs bytes (low nibbles are
 * elements 4g..4g+3, high nibbles 16+4g..16+4g+3; the kernel splits them). */
void qf_gemm_pack_panel(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r, int nrows, uint8_t *panel) {
    const int64_t nb = K / 32;
    const size_t bb = panel_block_bytes(wt);
    float *sc = (float *)(void *)(panel + (size_t)nb * bb);
    memset(panel, 0, (size_t)nb * bb);
    for (int i = 0; i < nrows; i++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)(r + i) * row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *pb = panel + (size_t)b * bb;
            if (wt == QF_TYPE_Q8_0) {
                const block_q8_0 *blk = (const block_q8_0 *)(const void *)wr + b;
                for (int g = 0; g < 8; g++)
                    for (int k = 0; k < 4; k++)
                        pb[(g * QF_GEMM_NR + i) * 4 + k] = (uint8_t)blk->qs[g * 4 + k] ^ 0x80;
                sc[b * QF_GEMM_NR + i] = qf_f16_to_f32(blk->d);
            } else if (wt == QF_TYPE_Q5_0) { /* unpacked to bytes q in [0, 31], the Q8_0 layout */
                const block_q5_0 *blk = (const block_q5_0 *)(const void *)wr + b;
                for (int g = 0; g < 8; g++)
                    for (int k = 0; k < 4; k++) pb[(g * QF_GEMM_NR + i) * 4 + k] = (uint8_t)q5_0_u(blk, g * 4 + k);
                sc[b * QF_GEMM_NR + i] = qf_f16_to_f32(blk->d);
            } else {
                const block_q4_0 *blk = (const block_q4_0 *)(const void *)wr + b;
                for (int g = 0; g < 4; g++) memcpy(pb + (g * QF_GEMM_NR + i) * 4, blk->qs + g * 4, 4);
                sc[b * QF_GEMM_NR + i] = qf_f16_to_f32(blk->d);
            }
        }
    }
    for (int i = nrows; i < QF_GEMM_NR; i++)
        for (int64_t b = 0; b < nb; b++) sc[b * QF_GEMM_NR + i] = 0.0f;
}

void qf_gemm_q8_rows_ref(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                         const uint8_t *act, int n, float *y, int64_t ldy) {
    const int64_t nb = K / 32;
    const size_t stride = qf_gemm_act_stride(K);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        for (int t = 0; t < n; t++) {
            const qf_gemm_act_row a = qf_gemm_act_view(act + (size_t)t * stride, K);
            const int8_t *xq = a.qs;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t isum = a.corr[b];
                float dw;
                if (wt == QF_TYPE_Q8_0) {
                    const block_q8_0 *blk = (const block_q8_0 *)(const void *)wr + b;
                    for (int j = 0; j < 32; j++) isum += (int32_t)((uint8_t)blk->qs[j] ^ 0x80) * xq[b * 32 + j];
                    dw = qf_f16_to_f32(blk->d);
                } else if (wt == QF_TYPE_Q5_0) {
                    const block_q5_0 *blk = (const block_q5_0 *)(const void *)wr + b;
                    for (int j = 0; j < 32; j++) isum += q5_0_u(blk, j) * xq[b * 32 + j];
                    dw = qf_f16_to_f32(blk->d);
                } else {
                    const block_q4_0 *blk = (const block_q4_0 *)(const void *)wr + b;
                    for (int j = 0; j < 16; j++)
                        isum += (int32_t)(blk->qs[j] & 0xF) * xq[b * 32 + j] + (int32_t)(blk->qs[j] >> 4) * xq[b * 32 + 16 + j];
                    dw = qf_f16_to_f32(blk->d);
                }
                float s = dw * a.d[b];
                acc = fmaf((float)isum, s, acc);
            }
            y[(size_t)t * ldy + r] = acc;
        }
    }
}

/* The tiling both integer GEMMs share: pack rows [r0, r1) into panels of QF_GEMM_NR rows (pb bytes
 * each) in scratch, then run `panel` over token blocks outermost, so a block's activations (stride
 * bytes a token) stay in L2 while every panel of the tile passes over them. */
typedef void (*gemm_pack_fn)(qf_type, const void *, size_t, int64_t, int64_t, int, uint8_t *);
typedef void (*gemm_panel_fn)(qf_type, const uint8_t *, int64_t, const uint8_t *, int, int, float *, int64_t, int);
static void gemm_tiled(gemm_pack_fn pack, gemm_panel_fn panel, size_t pb, size_t stride, qf_type wt, const void *w,
                       size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const uint8_t *act, int n, float *y,
                       int64_t ldy, void *scratch) {
    const int64_t np = (r1 - r0 + QF_GEMM_NR - 1) / QF_GEMM_NR;
    uint8_t *panels = scratch;
    for (int64_t p = 0; p < np; p++) {
        int64_t r = r0 + p * QF_GEMM_NR;
        int nr = r1 - r < QF_GEMM_NR ? (int)(r1 - r) : QF_GEMM_NR;
        pack(wt, w, row_bytes, K, r, nr, panels + (size_t)p * pb);
    }
    const int TB = stride * 64 <= (512u << 10) ? 64 : 32;
    for (int t0 = 0; t0 < n; t0 += TB) {
        int t1 = n - t0 < TB ? n : t0 + TB;
        for (int64_t p = 0; p < np; p++) {
            int64_t r = r0 + p * QF_GEMM_NR;
            int nr = r1 - r < QF_GEMM_NR ? (int)(r1 - r) : QF_GEMM_NR;
            panel(wt, panels + (size_t)p * pb, K, act, t0, t1, y + r, ldy, nr);
        }
    }
}

void qf_gemm_q8_rows(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                     const uint8_t *act, int n, float *y, int64_t ldy, void *scratch) {
    qf_gemm_isa isa = qf_gemm_isa_get();
    gemm_panel_fn panel = isa == QF_GEMM_ISA_AVX512    ? qf_gemm_panel_avx512
                          : isa == QF_GEMM_ISA_AVXVNNI ? qf_gemm_panel_avxvnni
                                                       : qf_gemm_panel_avx2;
    gemm_tiled(qf_gemm_pack_panel, panel, qf_gemm_panel_bytes(wt, K), qf_gemm_act_stride(K), wt, w, row_bytes, K, r0,
               r1, act, n, y, ldy, scratch);
}

/* ---------------------------------------------------------------------------------------- */
/* Q4_0 repacked into 16-row panels (gemm.h: Q4X16)                                          */

#define Q4X16_PAIR 576 /* bytes of one pair of blocks of a panel: 64 of scales + 2 x 256 of quants */

bool qf_gemm_q4x16_shape_ok(int64_t K, int64_t N) { return K > 0 && K % 64 == 0 && N > 0; }

size_t qf_gemm_q4x16_bytes(int64_t K, int64_t N) {
    return (size_t)((N + QF_GEMM_NR - 1) / QF_GEMM_NR) * (size_t)(K / 64) * Q4X16_PAIR;
}

void qf_gemm_q4x16_pack(const void *w, size_t row_bytes, int64_t K, int64_t N, int64_t p0, int64_t p1, uint8_t *out) {
    const int64_t np = K / 64;
    for (int64_t p = p0; p < p1; p++) {
        uint8_t *panel = out + (size_t)p * (size_t)np * Q4X16_PAIR;
        for (int i = 0; i < QF_GEMM_NR; i++) {
            const int64_t r = p * QF_GEMM_NR + i;
            const block_q4_0 *row = r < N ? (const block_q4_0 *)(const void *)((const uint8_t *)w + (size_t)r * row_bytes) : NULL;
            for (int64_t b = 0; b < K / 32; b++) {
                uint8_t *pair = panel + (size_t)(b / 2) * Q4X16_PAIR;
                uint8_t *q = pair + 64 + (b % 2) * 256;
                uint16_t d = row ? row[b].d : 0;
                memcpy(pair + (b % 2) * 32 + i * 2, &d, 2);
                for (int g = 0; g < 4; g++) {
                    if (row) memcpy(q + (g * QF_GEMM_NR + i) * 4, row[b].qs + g * 4, 4);
                    else memset(q + (g * QF_GEMM_NR + i) * 4, 0, 4);
                }
            }
        }
    }
}

bool qf_gemm_q4x16_supported(void) { return cpu_has_avx512vnni(); }

void qf_gemm_q4x16_rows_ref(const uint8_t *wp, int64_t K, int64_t r0, int64_t r1, const uint8_t *act, int n, float *y,
                            int64_t ldy) {
    const int64_t nb = K / 32;
    const size_t stride = qf_gemm_act_stride(K), pbytes = (size_t)(K / 64) * Q4X16_PAIR;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *panel = wp + (size_t)(r / QF_GEMM_NR) * pbytes;
        const int i = (int)(r % QF_GEMM_NR);
        for (int t = 0; t < n; t++) {
            const qf_gemm_act_row a = qf_gemm_act_view(act + (size_t)t * stride, K);
            const int8_t *xq = a.qs;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *pair = panel + (size_t)(b / 2) * Q4X16_PAIR, *q = pair + 64 + (b % 2) * 256;
                int32_t isum = a.corr[b];
                for (int g = 0; g < 4; g++)
                    for (int k = 0; k < 4; k++) {
                        const uint8_t v = q[(g * QF_GEMM_NR + i) * 4 + k];
                        isum += (int32_t)(v & 0xF) * xq[b * 32 + g * 4 + k] + (int32_t)(v >> 4) * xq[b * 32 + 16 + g * 4 + k];
                    }
                uint16_t dh;
                memcpy(&dh, pair + (b % 2) * 32 + i * 2, 2);
                float s = qf_f16_to_f32(dh) * a.d[b];
                acc = fmaf((float)isum, s, acc);
            }
            y[(size_t)t * ldy + r] = acc;
        }
    }
}

void qf_gemm_q4x16_rows(const uint8_t *wp, int64_t K, int64_t r0, int64_t r1, const uint8_t *act, int n, float *y,
                        int64_t ldy) {
    if (r0 >= r1) return;
    QF_ASSERT(r0 % QF_GEMM_NR == 0);
    if (!qf_gemm_q4x16_supported()) {
        qf_gemm_q4x16_rows_ref(wp, K, r0, r1, act, n, y, ldy);
        return;
    }
    const size_t pbytes = (size_t)(K / 64) * Q4X16_PAIR;
    /* token blocks outermost (as gemm_tiled): a block's activations stay in L2 over the row range */
    const int TB = qf_gemm_act_stride(K) * 64 <= (512u << 10) ? 64 : 32;
    for (int t0 = 0; t0 < n; t0 += TB) {
        int t1 = n - t0 < TB ? n : t0 + TB;
        for (int64_t r = r0; r < r1; r += QF_GEMM_NR) {
            int nr = r1 - r < QF_GEMM_NR ? (int)(r1 - r) : QF_GEMM_NR;
            qf_gemm_q4x16_panel_avx512(wp + (size_t)(r / QF_GEMM_NR) * pbytes, K, act, t0, t1, y + r, ldy, nr);
        }
    }
}

size_t qf_gemm_f16_scratch_bytes(int64_t rows) {
    return (size_t)((rows + QF_GEMM_F16_MR - 1) / QF_GEMM_F16_MR) * QF_GEMM_F16_MR * QF_GEMM_F16_KB * sizeof(float);
}

bool qf_gemm_f16_supported(void) { return qf_quant_has_avx2() && cpu_has_avx512vnni(); }

void qf_gemm_f16_rows(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const float *x, int n,
                      float *y, int64_t ldy, void *scratch) {
    if (qf_gemm_f16_supported()) qf_gemm_f16_rows_avx512(w, row_bytes, K, r0, r1, x, n, y, ldy, scratch);
    else qf_gemm_f16_rows_ref(w, row_bytes, K, r0, r1, x, n, y, ldy);
}

void qf_gemm_f16_rows_ref(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const float *x, int n,
                          float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *wr = (const uint16_t *)(const void *)((const uint8_t *)w + (size_t)r * row_bytes);
        for (int t = 0; t < n; t++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)qf_f16_to_f32(wr[k]) * x[(size_t)t * K + k];
            y[(size_t)t * ldy + r] = (float)s;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Q4_K / Q6_K                                                                               */

bool qf_gemm_k_type(qf_type t) { return t == QF_TYPE_Q4_K || t == QF_TYPE_Q6_K; }
bool qf_gemm_k_supported(qf_type t) { return qf_gemm_k_type(t) && qf_quant_has_avx2() && cpu_has_avx512vnni(); }

size_t qf_gemm_k_act_stride(int64_t K) {
    size_t s = (size_t)K + (size_t)(K / 256) * 4 + (size_t)(K / 16) * 4;
    return (s + 63) & ~(size_t)63;
}

void qf_gemm_k_quantize_act(const float *x, int64_t K, int t0, int t1, uint8_t *act, void *tmp) {
    const int64_t nb = K / 256;
    const size_t stride = qf_gemm_k_act_stride(K);
    block_q8_K *blk = tmp;
    for (int t = t0; t < t1; t++) {
        qf_quantize_row(QF_TYPE_Q8_K, x + (size_t)t * K, blk, K);
        uint8_t *row = act + (size_t)t * stride;
        float *d = (float *)(void *)(row + K);
        int32_t *bs = (int32_t *)(void *)(row + K + nb * 4);
        for (int64_t b = 0; b < nb; b++) {
            memcpy(row + b * 256, blk[b].qs, 256);
            d[b] = blk[b].d;
            for (int j = 0; j < 16; j++) bs[b * 16 + j] = blk[b].bsums[j];
        }
    }
}

/* sub-blocks per 256-block and their size */
static int k_nsub(qf_type wt) { return wt == QF_TYPE_Q4_K ? 8 : 16; }

/* per 256-block of a panel: 256 quant bytes x 16 rows as [group of 4][row][4]; then int32 scales
 * [sub][row], (Q4_K) int32 mins [sub][row], f32 d[row], (Q4_K) f32 dmin[row] */
static size_t k_block_bytes(qf_type wt) {
    size_t b = 256 * QF_GEMM_NR + (size_t)k_nsub(wt) * QF_GEMM_NR * 4 + QF_GEMM_NR * 4;
    if (wt == QF_TYPE_Q4_K) b += 8 * QF_GEMM_NR * 4 + QF_GEMM_NR * 4;
    return b;
}

size_t qf_gemm_k_panel_bytes(qf_type wt, int64_t K) { return (size_t)(K / 256) * k_block_bytes(wt); }

size_t qf_gemm_k_scratch_bytes(qf_type wt, int64_t K, int64_t rows) {
    return (size_t)((rows + QF_GEMM_NR - 1) / QF_GEMM_NR) * qf_gemm_k_panel_bytes(wt, K);
}

/* one 256-block of one row: unsigned quants in element order, integer scales (and mins), d (dmin) */
static void k_unpack(qf_type wt, const uint8_t *wr, int64_t b, uint8_t *q, int32_t *sc, int32_t *mn, float *d, float *dmin) {
    uint16_t dh, mh;
    qf_k_unpack(wt == QF_TYPE_Q6_K, wr, b, q, sc, mn, &dh, &mh); /* format/quant_blocks.h: shared with the GPU */
    *d = qf_f16_to_f32(dh);
    *dmin = wt == QF_TYPE_Q6_K ? 0.0f : qf_f16_to_f32(mh);
}

void qf_gemm_k_pack_panel(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r, int nrows, uint8_t *panel) {
    const int64_t nb = K / 256;
    const int ns = k_nsub(wt);
    const size_t bb = k_block_bytes(wt);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *pb = panel + (size_t)b * bb;
        int32_t *sc = (int32_t *)(void *)(pb + 256 * QF_GEMM_NR), *mn = sc + ns * QF_GEMM_NR;
        float *d = (float *)(void *)(mn + (wt == QF_TYPE_Q4_K ? 8 * QF_GEMM_NR : 0)), *dmin = d + QF_GEMM_NR;
        memset(pb, 0, bb);
        for (int i = 0; i < nrows; i++) {
            uint8_t q[256];
            int32_t s_[16], m_[8];
            float dd, dm;
            k_unpack(wt, (const uint8_t *)w + (size_t)(r + i) * row_bytes, b, q, s_, m_, &dd, &dm);
            for (int g = 0; g < 64; g++) memcpy(pb + (g * QF_GEMM_NR + i) * 4, q + 4 * g, 4);
            for (int s2 = 0; s2 < ns; s2++) sc[s2 * QF_GEMM_NR + i] = s_[s2];
            if (wt == QF_TYPE_Q4_K) {
                for (int s2 = 0; s2 < 8; s2++) mn[s2 * QF_GEMM_NR + i] = m_[s2];
                dmin[i] = dm;
            }
            d[i] = dd;
        }
    }
}

void qf_gemm_k_rows_ref(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                        const uint8_t *act, int n, float *y, int64_t ldy) {
    const int64_t nb = K / 256;
    const size_t stride = qf_gemm_k_act_stride(K);
    const int ns = k_nsub(wt), sub = 256 / ns;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        for (int t = 0; t < n; t++) {
            const uint8_t *row = act + (size_t)t * stride;
            const int8_t *xq = (const int8_t *)row;
            const float *dx = (const float *)(const void *)(row + K);
            const int32_t *bs = (const int32_t *)(const void *)(row + K + nb * 4);
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t q[256];
                int32_t sc[16], mn[8];
                float dd, dm;
                k_unpack(wt, wr, b, q, sc, mn, &dd, &dm);
                int32_t iacc = 0, im = 0;
                for (int s2 = 0; s2 < ns; s2++) {
                    int32_t is = 0;
                    if (wt == QF_TYPE_Q6_K) is = -32 * bs[b * 16 + s2];
                    else im += mn[s2] * (bs[b * 16 + 2 * s2] + bs[b * 16 + 2 * s2 + 1]);
                    for (int j = 0; j < sub; j++) is += (int32_t)q[s2 * sub + j] * xq[b * 256 + s2 * sub + j];
                    iacc += is * sc[s2];
                }
                acc = fmaf((float)iacc, dd * dx[b], acc);
                if (wt == QF_TYPE_Q4_K) acc = fmaf(-(float)im, dm * dx[b], acc);
            }
            y[(size_t)t * ldy + r] = acc;
        }
    }
}

void qf_gemm_k_rows(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                    const uint8_t *act, int n, float *y, int64_t ldy, void *scratch) {
    gemm_tiled(qf_gemm_k_pack_panel, qf_gemm_k_panel_avx512, qf_gemm_k_panel_bytes(wt, K), qf_gemm_k_act_stride(K), wt,
               w, row_bytes, K, r0, r1, act, n, y, ldy, scratch);
}
