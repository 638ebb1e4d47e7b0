/* unicode.h: the codepoint helpers the tokenizers share (internal). UTF-8 is decoded the way
 * llama.cpp decodes it, so invalid input maps to the same codepoints, and the category flags
 * match llama.cpp's unicode_cpt_flags bit for bit. */
#ifndef QF_UNICODE_H
#define QF_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    QF_CPT_UNDEFINED = 0x0001, /* unassigned (Cn); still nonzero, unlike "past the end" */
    QF_CPT_NUMBER = 0x0002,
    QF_CPT_LETTER = 0x0004,
    QF_CPT_SEPARATOR = 0x0008,
    QF_CPT_ACCENT_MARK = 0x0010,
    QF_CPT_PUNCTUATION = 0x0020,
    QF_CPT_SYMBOL = 0x0040,
    QF_CPT_CONTROL = 0x0080,
    QF_CPT_WHITESPACE = 0x0100,
};

/* Length of the UTF-8 sequence a lead byte announces (continuation bytes count as 1). */
static inline size_t qf_utf8_len(uint8_t lead) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

/* Decode one codepoint at s[*off] (< len) and advance *off. A byte that does not start a
 * complete sequence yields U+FFFD and advances by one, as llama.cpp's unicode_cpts_from_utf8. */
uint32_t qf_utf8_next(const uint8_t *s, size_t len, size_t *off);

/* Encode a codepoint (any value below 2^21) into out; returns 1..4. */
int qf_utf8_encode(uint32_t cpt, uint8_t out[4]);

/* llama.cpp-compatible category flags (QF_CPT_*); codepoints past U+10FFFF are UNDEFINED. */
uint16_t qf_cpt_flags(uint32_t cpt);

#endif
