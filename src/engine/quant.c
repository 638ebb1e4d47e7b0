/* quant.c: ggml tensor block formats: the type table, the scalar reference kernels (the
 * oracle every fast kernel is tested against) and the run-time dispatch to quant_avx2.c.
 * Block layouts and rounding follow ggml (ggml-quants.c) so results are bit-exact with it. */
#include <ctype.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "qforge/quant.h"
#include "util/util.h"

/* ---- type table ----
 * Every type ggml defines a size for, including ones we only recognise (so the GGUF reader
 * can size their data and give a precise "unsupported" message). */
typedef struct {
    const char *name;
    int64_t blck;
    size_t bytes;
    bool supported;
} type_info;

static const type_info TYPES[QF_TYPE_COUNT] = {
    [QF_TYPE_F32] = {"f32", 1, 4, true},
    [QF_TYPE_F16] = {"f16", 1, 2, true},
    [QF_TYPE_Q4_0] = {"q4_0", 32, 18, true},
    [QF_TYPE_Q4_1] = {"q4_1", 32, 20, false},
    [QF_TYPE_Q5_0] = {"q5_0", 32, 22, true},
    [QF_TYPE_Q5_1] = {"q5_1", 32, 24, false},
    [QF_TYPE_Q8_0] = {"q8_0", 32, 34, true},
    [QF_TYPE_Q8_1] = {"q8_1", 32, 36, false},
    [QF_TYPE_Q2_K] = {"q2_K", 256, 84, false},
    [QF_TYPE_Q3_K] = {"q3_K", 256, 110, false},
    [QF_TYPE_Q4_K] = {"q4_K", 256, 144, true},
    [QF_TYPE_Q5_K] = {"q5_K", 256, 176, true},
    [QF_TYPE_Q6_K] = {"q6_K", 256, 210, true},
    /* Q8_K is an activation format only: a weight of this type has no vec_dot partner. */
    [QF_TYPE_Q8_K] = {"q8_K", 256, 292, false},
    [16] = {"iq2_xxs", 256, 66, false},
    [17] = {"iq2_xs", 256, 74, false},
    [18] = {"iq3_xxs", 256, 98, false},
    [19] = {"iq1_s", 256, 50, false},
    [20] = {"iq4_nl", 32, 18, false},
    [21] = {"iq3_s", 256, 110, false},
    [22] = {"iq2_s", 256, 82, false},
    [23] = {"iq4_xs", 256, 136, false},
    [QF_TYPE_I8] = {"i8", 1, 1, false},
    [QF_TYPE_I16] = {"i16", 1, 2, false},
    [QF_TYPE_I32] = {"i32", 1, 4, false},
    [QF_TYPE_I64] = {"i64", 1, 8, false},
    [QF_TYPE_F64] = {"f64", 1, 8, false},
    [29] = {"iq1_m", 256, 56, false},
    [QF_TYPE_BF16] = {"bf16", 1, 2, true},
    [34] = {"tq1_0", 256, 54, false},
    [35] = {"tq2_0", 256, 66, false},
    [39] = {"mxfp4", 32, 17, false},
};

static const type_info *info(qf_type t) {
    if ((int)t < 0 || (int)t >= QF_TYPE_COUNT || !TYPES[t].name) return NULL;
    return &TYPES[t];
}

const char *qf_type_name(qf_type t) {
    const type_info *ti = info(t);
    return ti ? ti->name : NULL;
}

bool qf_type_from_name(const char *name, qf_type *out) {
    if (!name) return false;
    for (int t = 0; t < QF_TYPE_COUNT; t++) {
        if (TYPES[t].name && strcasecmp(TYPES[t].name, name) == 0) {
            if (out) *out = (qf_type)t;
            return true;
        }
    }
    return false;
}

bool qf_type_is_known(qf_type t) { return info(t) != NULL; }

bool qf_type_is_supported(qf_type t) {
    const type_info *ti = info(t);
    return ti && ti->supported;
}

int64_t qf_type_block_elems(qf_type t) {
    const type_info *ti = info(t);
    return ti ? ti->blck : 0;
}

size_t qf_type_block_bytes(qf_type t) {
    const type_info *ti = info(t);
    return ti ? ti->bytes : 0;
}

size_t qf_row_bytes(qf_type t, int64_t n) {
    const type_info *ti = info(t);
    if (!ti || n < 0 || n % ti->blck != 0) return 0;
    return (size_t)(n / ti->blck) * ti->bytes;
}

qf_type qf_vec_dot_type(qf_type t) {
    switch (t) {
    case QF_TYPE_Q4_0:
    case QF_TYPE_Q5_0:
    case QF_TYPE_Q8_0: return QF_TYPE_Q8_0;
    case QF_TYPE_Q4_K:
    case QF_TYPE_Q5_K:
    case QF_TYPE_Q6_K: return QF_TYPE_Q8_K;
    default: return t;
    }
}
