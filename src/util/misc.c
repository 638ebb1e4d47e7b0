/* misc.c: half-precision conversion, the monotonic clock and the TTY progress bar. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t qf_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65520: overflow to inf */
    if (ax < 0x38800000u) {                      /* below smallest normal: subnormal or zero */
        float v = bits_f32(ax);
        /* v / 2^-24 rounded to nearest even (rintf honours the default rounding mode) */
        return sign | (uint16_t)rintf(v * 16777216.0f);
    }
    uint32_t mant_odd = (ax >> 13) & 1;
    ax += 0xfffu + mant_odd; /* round to nearest even on the 13 dropped bits */
    return sign | (uint16_t)((ax - (112u << 23)) >> 13);
}

uint16_t qf_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64); /* quiet nan */
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

double qf_now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void qf_progress_begin(qf_progress *p, const char *label, int64_t total) {
    p->label = label;
    p->total = total > 0 ? total : 1;
    p->t0 = qf_now_sec();
    p->last_draw = 0;
    p->tty = isatty(STDERR_FILENO) && getenv("QF_NO_PROGRESS") == NULL;
}

void qf_progress_update(qf_progress *p, int64_t done) {
    if (!p->tty) return;
    double now = qf_now_sec();
    if (done < p->total && now - p->last_draw < 0.1) return;
    p->last_draw = now;
    int width = 30;
    double frac = (double)done / (double)p->total;
    if (frac > 1) frac = 1;
    int fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    double el = now - p->t0;
    double eta = frac > 0 ? el / frac - el : 0;
    fprintf(stderr, "\r%-10s [%s] %5.1f%% %6.1fs eta %5.1fs", p->label, bar, frac * 100.0, el, eta);
    fflush(stderr);
}

void qf_progress_end(qf_progress *p) {
    if (!p->tty) return;
    qf_progress_update(p, p->total);
    fputc('\n', stderr);
}

/* the contract: util.h. Keys: the float's bits made unsigned-ordered (negatives flipped, the
 * sign bit set on positives), both zeros mapped to +0's key; 4 stable counting passes of 8 bits,
 * a pass skipped when every key has the same digit there. */
static inline uint32_t sort_key(uint32_t u) {
    if (!(u & 0x7FFFFFFFu)) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

bool qf_sort_floats(float *v, size_t n) {
    if (n < 2) return true;
    uint32_t *a = malloc(sizeof(uint32_t) * n), *b = malloc(sizeof(uint32_t) * n);
    if (!a || !b) {
        free(a), free(b);
        return false;
    }
    memcpy(a, v, sizeof(uint32_t) * n);
    size_t cnt[4][256] = {{0}};
    for (size_t i = 0; i < n; i++) {
        QF_ASSERT(v[i] == v[i]); /* not NaN */
        const uint32_t k = sort_key(a[i]);
        for (int p = 0; p < 4; p++) cnt[p][(k >> (8 * p)) & 255]++;
    }
    uint32_t *src = a, *dst = b;
    const uint32_t k0 = sort_key(a[0]);
    for (int p = 0; p < 4; p++) {
        if (cnt[p][(k0 >> (8 * p)) & 255] == n) continue;
        size_t off[256], s = 0;
        for (int d = 0; d < 256; d++) off[d] = s, s += cnt[p][d];
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = src[i];
            dst[off[(sort_key(u) >> (8 * p)) & 255]++] = u;
        }
        uint32_t *t = src;
        src = dst, dst = t;
    }
    memcpy(v, src, sizeof(uint32_t) * n);
    free(a), free(b);
    return true;
}
