/* utf8.c: the one strict UTF-8 validator (RFC 3629), shared by the artifact container (CBOR
 * text must be UTF-8) and the corpus reader (binary detection, U+FFFD replacement). The
 * tokenizers decode with llama.cpp's lenient rules instead (text/unicode.h). */
#include <string.h>

#include "util.h"

size_t qf_utf8_valid_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t b = s[0];
    if (b < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if (b >= 0xC2 && b <= 0xDF) len = 2, cp = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, cp = b & 0x0F;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, cp = b & 0x07;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return len;
}

bool qf_utf8_valid(const void *s, size_t n) {
    const uint8_t *u = s;
    for (size_t i = 0; i < n;) {
        size_t l = qf_utf8_valid_len(u + i, n - i);
        if (!l) return false;
        i += l;
    }
    return true;
}
