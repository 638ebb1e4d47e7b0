/* cuda_env.h: the CUDA backend's knobs from the environment, the one parser of them (the CLI's
 * defaults, and bench_gpu's; the library never reads the environment). */
#ifndef QF_TOOLS_CUDA_ENV_H
#define QF_TOOLS_CUDA_ENV_H

#include <stdlib.h>
#include <string.h>

#include "qforge/model.h"

/* Sets k's knobs that the environment asks for and leaves the others as they are:
 * QF_CUDA_GEMM=f32, QF_CUDA_ATTN=warp, QF_CUDA_GU16=1, QF_CUDA_F16_CACHE=0, QF_CUDA_PROFILE=1,
 * QF_CUDA_GRAPH=0, QF_CUDA_PDL=0, QF_CUDA_Q4G=0, QF_CUDA_I8_EXPAND=1, QF_CUDA_NORM_FOLD=0. Any
 * other value leaves its knob alone. */
static inline void cli_cuda_env(qf_cuda_params *k) {
    const char *v;
    if ((v = getenv("QF_CUDA_GEMM")) && strcmp(v, "f32") == 0) k->gemm_f32 = true;
    if ((v = getenv("QF_CUDA_ATTN")) && strcmp(v, "warp") == 0) k->attn_warp = true;
    if ((v = getenv("QF_CUDA_GU16")) && strcmp(v, "1") == 0) k->gu16 = true;
    if ((v = getenv("QF_CUDA_F16_CACHE")) && strcmp(v, "0") == 0) k->no_f16_cache = true;
    if ((v = getenv("QF_CUDA_PROFILE")) && atoi(v) > 0) k->profile = true;
    if ((v = getenv("QF_CUDA_GRAPH")) && strcmp(v, "0") == 0) k->no_graph = true;
    if ((v = getenv("QF_CUDA_PDL")) && strcmp(v, "0") == 0) k->no_pdl = true;
    if ((v = getenv("QF_CUDA_Q4G")) && strcmp(v, "0") == 0) k->no_q4_regroup = true;
    if ((v = getenv("QF_CUDA_I8_EXPAND")) && strcmp(v, "1") == 0) k->i8_expand = true;
    if ((v = getenv("QF_CUDA_NORM_FOLD")) && strcmp(v, "0") == 0) k->no_norm_fold = true;
}

#endif
