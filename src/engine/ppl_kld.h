/* ppl_kld.h: KL-divergence bookkeeping for ppl.c (included there only).
 * Placeholder until the llama.cpp-compatible base-file format lands: --kl-divergence-base and
 * --kl-divergence answer NotYetImplemented rather than pretending. */
#ifndef QF_PPL_KLD_H
#define QF_PPL_KLD_H

typedef struct {
    bool reading, writing;
    int n_chunk;
} kld_state;

static qf_status kld_begin(kld_state *k, const qf_ppl_params *p, int n_ctx, int n_vocab, int n_chunk,
                           const int32_t *tokens, qf_error *err) {
    (void)n_ctx, (void)n_vocab, (void)n_chunk, (void)tokens;
    memset(k, 0, sizeof *k);
    if (p->kl_base_read || p->kl_base_write)
        return qf_fail(err, QF_ERR_NOT_IMPLEMENTED, "KL divergence is not built yet");
    return QF_OK;
}
static qf_status kld_chunk(kld_state *k, const float *logits, const int32_t *next, int n, qf_error *err) {
    (void)k, (void)logits, (void)next, (void)n, (void)err;
    return QF_OK;
}
static qf_status kld_finish(kld_state *k, qf_ppl_result *r, qf_error *err) {
    (void)k, (void)r, (void)err;
    return QF_OK;
}
static void kld_end(kld_state *k) { (void)k; }

#endif
