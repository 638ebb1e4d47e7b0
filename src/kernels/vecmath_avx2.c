/* vecmath_avx2.c: AVX2/FMA exp for the softmax and SiLU (compiled with -mavx2 -mfma). Each lane,
 * and each element of a tail, computes canon.h's canonical scalar (qf_canon_exp, the row sums'
 * 8 double lanes): the same bits as the scalar fallbacks in vecmath.c on any CPU.
 *
 * exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 (ln 2 split in two parts so r is
 * exact to f32), exp(r) by a degree-6 polynomial on |r| <= ln2/2 (Cephes' expf coefficients).
 * Inputs are clamped to [-87.3, 88.0] (k <= 127, no overflow): below, the result is flushed to 0 as the softmax and
 * SiLU want; above, the result saturates at e^88 (only SiLU of x < -88 can get there, and it
 * still yields 0). */
#include <immintrin.h>
#include <math.h>

#include "kernels/canon.h"
#include "kernels/vecmath.h"

static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

bool qf_vec_exp_avx2(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) x[i] = qf_canon_exp(x[i]); /* the same lane, scalar */
    return true;
}

float qf_vec_max_avx2(const float *x, int n) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float mx = _mm_cvtss_f32(h);
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

static inline __m256d add_f32x8_pd(__m256d s, __m256 v, __m256d *s1) {
    *s1 = _mm256_add_pd(*s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    return _mm256_add_pd(s, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
}

static inline double hsum_pd(__m256d a, __m256d b) {
    __m256d s = _mm256_add_pd(a, b);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

double qf_vec_sum_exp_avx2(const float *x, int n, float mx) {
    const __m256 vm = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) s0 = add_f32x8_pd(s0, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm)), &s1);
    double sum = hsum_pd(s0, s1);
    for (; i < n; i++) sum += qf_canon_exp(x[i] - mx);
    return sum;
}

void qf_softmax_avx2(float *x, int n) {
    const float mx = qf_vec_max_avx2(x, n);
    const __m256 vm = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        s0 = add_f32x8_pd(s0, e, &s1);
    }
    double sum = hsum_pd(s0, s1);
    for (; i < n; i++) sum += (x[i] = qf_canon_exp(x[i] - mx));
    const float inv = (float)(1.0 / sum);
    const __m256 vi = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vi));
    for (; i < n; i++) x[i] *= inv;
}

void qf_vec_silu_mul_avx2(float *g, const float *u, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i), e = exp8(_mm256_xor_ps(gv, sign));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = qf_canon_silu_mul(g[i], u[i]);
}

void qf_rmsnorm_row_avx2(float *out, const float *x, const float *g, int n, float eps) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        s0 = add_f32x8_pd(s0, _mm256_mul_ps(v, v), &s1);
    }
    double ss = hsum_pd(s0, s1);
    for (; i < n; i++) ss += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(g + i)));
    for (; i < n; i++) out[i] = x[i] * scale * g[i];
}

/* qf_vec_rows_dot (vecmath.h): lane r of acc is output o + r; each 8 x 8 block of the eight rows
 * is transposed so that c[j] holds column i + j, then acc += c[j] * x[i + j] for j in order (a
 * multiply then an add: no FMA, as the oracle) */
void qf_vec_rows_dot_avx2(const float *A, size_t lda, int n, const float *x, int m, float *y) {
    int o = 0;
    for (; o + 8 <= m; o += 8) {
        const float *a = A + (size_t)o * lda;
        __m256 acc = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 r0 = _mm256_loadu_ps(a + i), r1 = _mm256_loadu_ps(a + lda + i),
                   r2 = _mm256_loadu_ps(a + 2 * lda + i), r3 = _mm256_loadu_ps(a + 3 * lda + i),
                   r4 = _mm256_loadu_ps(a + 4 * lda + i), r5 = _mm256_loadu_ps(a + 5 * lda + i),
                   r6 = _mm256_loadu_ps(a + 6 * lda + i), r7 = _mm256_loadu_ps(a + 7 * lda + i);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                   t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
                   s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)),
                   s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2)),
                   s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
#define ROWS_DOT_STEP(c, j) acc = _mm256_add_ps(acc, _mm256_mul_ps((c), _mm256_set1_ps(x[i + (j)])))
            ROWS_DOT_STEP(_mm256_permute2f128_ps(s0, s4, 0x20), 0);
            ROWS_DOT_STEP(_mm256_permute2f128_ps(s1, s5, 0x20), 1);
            ROWS_DOT_STEP(_mm256_permute2f128_ps(s2, s6, 0x20), 2);
            ROWS_DOT_STEP(_mm256_permute2f128_ps(s3, s7, 0x20), 3);
            ROWS_DOT_STEP(_mm256_permute2f128_ps(s0, s4, 0x31), 4);
            ROWS_DOT_STEP(_mm256_permute2f128_ps(s1, s5, 0x31), 5);
            ROWS_DOT_STEP(_mm256_permute2f128_ps(s2, s6, 0x31), 6);
            ROWS_DOT_STEP(_mm256_permute2f128_ps(s3, s7, 0x31), 7);
#undef ROWS_DOT_STEP
        }
        float t[8];
        _mm256_storeu_ps(t, acc);
        for (; i < n; i++)
            for (int r = 0; r < 8; r++) t[r] += a[(size_t)r * lda + i] * x[i];
        for (int r = 0; r < 8; r++) y[o + r] = t[r];
    }
    if (o < m) qf_vec_rows_dot_ref(A + (size_t)o * lda, lda, n, x, m - o, y + o);
}

/* four rows' floats [i, i + 4) as doubles, transposed: c[j] lane r = (double)a[r * lda + i + j] */
static inline void rows4_cols(const float *a, size_t lda, int i, __m256d c[4]) {
    const __m256d r0 = _mm256_cvtps_pd(_mm_loadu_ps(a + i)), r1 = _mm256_cvtps_pd(_mm_loadu_ps(a + lda + i)),
                  r2 = _mm256_cvtps_pd(_mm_loadu_ps(a + 2 * lda + i)), r3 = _mm256_cvtps_pd(_mm_loadu_ps(a + 3 * lda + i));
    const __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1), t2 = _mm256_unpacklo_pd(r2, r3),
                  t3 = _mm256_unpackhi_pd(r2, r3);
    c[0] = _mm256_permute2f128_pd(t0, t2, 0x20), c[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
    c[2] = _mm256_permute2f128_pd(t0, t2, 0x31), c[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}

/* qf_vec_rows_dot_f64 (vecmath.h): lanes of lo / hi are outputs o .. o + 3 / o + 4 .. o + 7, each
 * adding its column's products in i order (a multiply then an add: no FMA, as the oracle) */
void qf_vec_rows_dot_f64_avx2(const float *A, size_t lda, int n, const float *x, int m, double *y) {
    int o = 0;
    for (; o + 8 <= m; o += 8) {
        const float *a = A + (size_t)o * lda;
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            __m256d cl[4], ch[4];
            rows4_cols(a, lda, i, cl);
            rows4_cols(a + 4 * lda, lda, i, ch);
#define ROWS_DOT_F64_STEP(j)                                         \
    do {                                                             \
        const __m256d xj = _mm256_set1_pd((double)x[i + (j)]);       \
        lo = _mm256_add_pd(lo, _mm256_mul_pd(cl[j], xj));            \
        hi = _mm256_add_pd(hi, _mm256_mul_pd(ch[j], xj));            \
    } while (0)
            ROWS_DOT_F64_STEP(0);
            ROWS_DOT_F64_STEP(1);
            ROWS_DOT_F64_STEP(2);
            ROWS_DOT_F64_STEP(3);
#undef ROWS_DOT_F64_STEP
        }
        double t[8];
        _mm256_storeu_pd(t, lo);
        _mm256_storeu_pd(t + 4, hi);
        for (; i < n; i++)
            for (int r = 0; r < 8; r++) t[r] += (double)a[(size_t)r * lda + i] * (double)x[i];
        for (int r = 0; r < 8; r++) y[o + r] = t[r];
    }
    if (o < m) qf_vec_rows_dot_f64_ref(A + (size_t)o * lda, lda, n, x, m - o, y + o);
}

/* qf_vec_cols_axpy (vecmath.h): lane r of a register is element i + r; 32 elements stay in four
 * registers while j runs over every column in order (a multiply then an add, no FMA, zero y[j]
 * skipped as the oracle skips them), then 8 at a time, the last n % 8 by the oracle */
void qf_vec_cols_axpy_avx2(const float *B, size_t ldb, int m, const float *y, int n, float *acc) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8), a2 = _mm256_loadu_ps(acc + i + 16),
               a3 = _mm256_loadu_ps(acc + i + 24);
        for (int j = 0; j < m; j++) {
            if (y[j] == 0) continue;
            const __m256 yj = _mm256_set1_ps(y[j]);
            const float *b = B + (size_t)j * ldb + i;
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(b), yj));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(b + 8), yj));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_loadu_ps(b + 16), yj));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_loadu_ps(b + 24), yj));
        }
        _mm256_storeu_ps(acc + i, a0), _mm256_storeu_ps(acc + i + 8, a1);
        _mm256_storeu_ps(acc + i + 16, a2), _mm256_storeu_ps(acc + i + 24, a3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + i);
        for (int j = 0; j < m; j++)
            if (y[j] != 0) a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(B + (size_t)j * ldb + i), _mm256_set1_ps(y[j])));
        _mm256_storeu_ps(acc + i, a0);
    }
    if (i < n) qf_vec_cols_axpy_ref(B + i, ldb, m, y, n - i, acc + i);
}

void qf_vec_axpy_diff_avx2(const float *X, const float *Y, size_t ld, int m, const float *w, int n, float *acc) {
    int i = 0;
#define AD(a, o) a = _mm256_add_ps(a, _mm256_mul_ps(wj, _mm256_sub_ps(_mm256_loadu_ps(x + (o)), _mm256_loadu_ps(y + (o)))))
    for (; i + 32 <= n; i += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8), a2 = _mm256_loadu_ps(acc + i + 16),
               a3 = _mm256_loadu_ps(acc + i + 24);
        for (int j = 0; j < m; j++) {
            const __m256 wj = _mm256_set1_ps(w[j]);
            const float *x = X + (size_t)j * ld + i, *y = Y + (size_t)j * ld + i;
            AD(a0, 0), AD(a1, 8), AD(a2, 16), AD(a3, 24);
        }
        _mm256_storeu_ps(acc + i, a0), _mm256_storeu_ps(acc + i + 8, a1);
        _mm256_storeu_ps(acc + i + 16, a2), _mm256_storeu_ps(acc + i + 24, a3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + i);
        for (int j = 0; j < m; j++) {
            const __m256 wj = _mm256_set1_ps(w[j]);
            const float *x = X + (size_t)j * ld + i, *y = Y + (size_t)j * ld + i;
            AD(a0, 0);
        }
        _mm256_storeu_ps(acc + i, a0);
    }
#undef AD
    if (i < n) qf_vec_axpy_diff_ref(X + i, Y + i, ld, m, w, n - i, acc + i);
}

/* qf_vec_dict_scores (vecmath.h): lane r is row t + r; per slot, its eight indices and
 * coefficients are contiguous (slot-major codes) and the eight P values gathered */
void qf_vec_dict_scores_avx2(const float *P, const int32_t *idx, const float *coef, size_t ld, int s, int m, float *y) {
    int t = 0;
    for (; t + 8 <= m; t += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < s; j++) {
            const size_t o = (size_t)j * ld + (size_t)t;
            const __m256i ix = _mm256_loadu_si256((const __m256i *)(idx + o));
            const __m256 p = _mm256_i32gather_ps(P, ix, 4);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(coef + o), p));
        }
        _mm256_storeu_ps(y + t, acc);
    }
    if (t < m) qf_vec_dict_scores_ref(P, idx + t, coef + t, ld, s, m - t, y + t);
}

void qf_vec_gather_axpy_avx2(const float *B, size_t ldb, const int32_t *idx, const float *c, int m, int n, float *out) {
    int i = 0;
#define GA(a, o) a = _mm256_add_ps(a, _mm256_mul_ps(cj, _mm256_loadu_ps(b + (o))))
    for (; i + 32 <= n; i += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int j = 0; j < m; j++) {
            const __m256 cj = _mm256_set1_ps(c[j]);
            const float *b = B + (size_t)idx[j] * ldb + i;
            GA(a0, 0), GA(a1, 8), GA(a2, 16), GA(a3, 24);
        }
        _mm256_storeu_ps(out + i, a0), _mm256_storeu_ps(out + i + 8, a1);
        _mm256_storeu_ps(out + i + 16, a2), _mm256_storeu_ps(out + i + 24, a3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a0 = _mm256_setzero_ps();
        for (int j = 0; j < m; j++) {
            const __m256 cj = _mm256_set1_ps(c[j]);
            const float *b = B + (size_t)idx[j] * ldb + i;
            GA(a0, 0);
        }
        _mm256_storeu_ps(out + i, a0);
    }
#undef GA
    if (i < n) {
        for (int k = i; k < n; k++) out[k] = 0;
        for (int j = 0; j < m; j++) {
            const float a = c[j], *b = B + (size_t)idx[j] * ldb;
            for (int k = i; k < n; k++) out[k] += a * b[k];
        }
    }
}
