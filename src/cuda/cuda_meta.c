/*
 * cuda_meta.c - the host side of the GPU's paged attention: a batch's
 * kv_seq block tables flattened into the one int32 array the decode
 * attention kernel reads (layout in kt_cuda.h), built each step and
 * uploaded in one copy. Plain C, tested on the CPU (tests/test_cuda_host.c).
 *
 * The kernel reads the pool's planes in place, so the array holds the
 * pool's block ids as the tables do; a sequence with several tokens in
 * the step (a verify pass) has its table copied once.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cuda/kt_cuda.h"

size_t kt_cuda_attn_meta_len(const kt_cuda_attn_meta *m) { return (size_t)m->n_entries + 3 * (size_t)m->n_tokens; }

void kt_cuda_attn_meta_free(kt_cuda_attn_meta *m) {
    if (!m) return;
    free(m->buf);
    memset(m, 0, sizeof *m);
}

kt_status kt_cuda_attn_meta_build(kt_cuda_attn_meta *m, const kv_seq *const *seqs, int n_seqs, const int *tok_seq,
                                  const int *n_pos, int n_tokens, kt_error *err) {
    if (!m || !seqs || !tok_seq || !n_pos || n_seqs < 1 || n_tokens < 1)
        return kt_error_set(err, KT_ERR_ARG, "attention metadata: %d tokens of %d sequences", n_tokens, n_seqs);
    const kv_pool *pool = seqs[0] ? seqs[0]->pool : NULL;
    if (!pool) return kt_error_set(err, KT_ERR_ARG, "attention metadata: sequence 0 is NULL");
    const kv_pool_params *p = kv_pool_get_params(pool);
    if (p->type != KV_F16)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "attention metadata: the CUDA attention reads F16 KV, this pool's is %s",
                            p->type == KV_F32 ? "F32" : "Q8_0");
    if (kv_params_n_windowed(p) > 0)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "attention metadata: the pool has sliding-window layers, which the CUDA attention does "
                            "not read yet");
    for (int s = 0; s < n_seqs; s++)
        if (!seqs[s] || seqs[s]->pool != pool)
            return kt_error_set(err, KT_ERR_ARG, "attention metadata: sequence %d is %s", s,
                                seqs[s] ? "on another pool" : "NULL");
    /* where each used sequence's table goes, -1: not used */
    int *at = malloc((size_t)n_seqs * sizeof *at);
    if (!at) return kt_error_set(err, KT_ERR_NOMEM, "attention metadata: out of memory (%d sequences)", n_seqs);
    for (int s = 0; s < n_seqs; s++) at[s] = -1;
    long long entries = 0;
    for (int t = 0; t < n_tokens; t++) {
        const int s = tok_seq[t];
        if (s < 0 || s >= n_seqs || n_pos[t] < 1 || n_pos[t] > seqs[s]->len) {
            kt_status st = kt_error_set(err, KT_ERR_ARG,
                                        "attention metadata: token %d is of sequence %d (of %d) and attends %d "
                                        "positions (1 to the sequence's length, %d)",
                                        t, s, n_seqs, n_pos[t], s >= 0 && s < n_seqs ? seqs[s]->len : -1);
            free(at);
            return st;
        }
        if (at[s] < 0) {
            at[s] = (int)entries;
            entries += seqs[s]->n_blocks;
            if (entries > INT_MAX / 2) {
                free(at);
                return kt_error_set(err, KT_ERR_ARG, "attention metadata: %lld block table entries", entries);
            }
        }
    }
    const size_t need = (size_t)entries + 3 * (size_t)n_tokens;
    if (need > m->cap) {
        int32_t *nb = realloc(m->buf, need * sizeof *nb);
        if (!nb) {
            free(at);
            return kt_error_set(err, KT_ERR_NOMEM, "attention metadata: out of memory (%zu entries)", need);
        }
        m->buf = nb;
        m->cap = need;
    }
    m->n_tokens = n_tokens;
    m->n_entries = (int)entries;
    m->block_tokens = p->block_tokens;
    m->row_bytes = kv_pool_row_bytes(pool);
    m->block_bytes = kv_pool_block_bytes(pool);
    int32_t *off = m->buf + entries, *np = off + n_tokens, *pos = np + n_tokens;
    for (int s = 0; s < n_seqs; s++)
        if (at[s] >= 0) memcpy(m->buf + at[s], seqs[s]->blocks, (size_t)seqs[s]->n_blocks * sizeof(int32_t));
    for (int t = 0; t < n_tokens; t++) {
        off[t] = at[tok_seq[t]];
        np[t] = n_pos[t];
        pos[t] = n_pos[t] - 1;
    }
    free(at);
    return KT_OK;
}
