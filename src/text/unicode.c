/* unicode.c: UTF-8 decoding with llama.cpp's error semantics, UTF-8 encoding, and the codepoint
 * category lookup over the generated range table (src/engine/unicode_tables.h). */
#include "text/unicode.h"

#include "text/unicode_tables.h"

uint32_t qf_utf8_next(const uint8_t *s, size_t len, size_t *off) {
    size_t o = *off;
    uint8_t c = s[o];
    if (!(c & 0x80)) {
        *off = o + 1;
        return c;
    }
    /* a continuation byte, a 5+ byte lead, or a sequence cut short: one U+FFFD per byte */
    size_t n = (c & 0x40) == 0 ? 0 : (c & 0x20) == 0 ? 2 : (c & 0x10) == 0 ? 3 : (c & 0x08) == 0 ? 4 : 0;
    if (n == 0 || o + n > len) {
        *off = o + 1;
        return 0xFFFD;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[o + i] & 0xC0) != 0x80) {
            *off = o + 1;
            return 0xFFFD;
        }
    }
    uint32_t cpt;
    if (n == 2) cpt = ((uint32_t)(c & 0x1F) << 6) | (s[o + 1] & 0x3F);
    else if (n == 3) cpt = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[o + 1] & 0x3F) << 6) | (s[o + 2] & 0x3F);
    else cpt = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[o + 1] & 0x3F) << 12) |
               ((uint32_t)(s[o + 2] & 0x3F) << 6) | (s[o + 3] & 0x3F);
    *off = o + n;
    return cpt;
}

int qf_utf8_encode(uint32_t cpt, uint8_t out[4]) {
    if (cpt <= 0x7F) {
        out[0] = (uint8_t)cpt;
        return 1;
    }
    if (cpt <= 0x7FF) {
        out[0] = (uint8_t)(0xC0 | (cpt >> 6));
        out[1] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt <= 0xFFFF) {
        out[0] = (uint8_t)(0xE0 | (cpt >> 12));
        out[1] = (uint8_t)(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 3;
    }
    /* the decoder can produce up to 0x1FFFFF from a bogus F4..F7 lead: keep its bytes */
    out[0] = (uint8_t)(0xF0 | ((cpt >> 18) & 0x07));
    out[1] = (uint8_t)(0x80 | ((cpt >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cpt >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cpt & 0x3F));
    return 4;
}

uint16_t qf_cpt_flags(uint32_t cpt) {
    static const size_t n = sizeof qf_unicode_ranges / sizeof qf_unicode_ranges[0];
    if (cpt >= 0x110000) return QF_CPT_UNDEFINED;
    size_t lo = 0, hi = n; /* last range whose start <= cpt */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (qf_unicode_ranges[mid].start <= cpt) lo = mid;
        else hi = mid;
    }
    return qf_unicode_ranges[lo].flags;
}
