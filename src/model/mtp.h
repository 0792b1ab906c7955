/*
 * mtp.h - Qwen 3.5's multi-token-prediction (MTP) head run as a draft:
 * the file's own extra decoder block guesses the token after next from
 * the target's last hidden state and the token just sampled (see
 * llm_mtp in model.h).
 *
 * Why a file of its own: the block is not part of the trunk's pass (the
 * target never runs it), it takes two inputs per token (an id and the
 * target's hidden row) and gives two outputs (logits and its own hidden
 * row, which a chained guess takes in place of the target's); forward.c
 * runs its decoder block (llm_forward_block) and nothing else here.
 *
 * Positions, as llama.cpp's draft-mtp runs it (common/speculative.cpp,
 * process() and draft()): the MTP's row at position p takes token x_p and
 * the target's hidden state h_{p-1} (after the output norm; zeros at
 * p = 0) and gives logits for x_{p+1}. Its K and V go to the sequence's
 * KV layer cfg.n_kv_layer (a pool made with llm_mtp_kv_params), so they
 * are truncated with the target's rows.
 */
#ifndef KT_MODEL_MTP_H
#define KT_MODEL_MTP_H

#include "model/forward.h"

/* p, the pool's parameters for m (llm_kv_params), with the MTP block's
 * KV layer added when m has one. */
void llm_mtp_kv_params(const llm_model *m, kv_pool_params *p);

/* Runs the MTP block on b's tokens (b->tokens, pos, seq; every sequence's
 * pool made with llm_mtp_kv_params; the same order rules as llm_forward),
 * token t with the hidden row h_in[t] (n_embd floats; NULL rows of zeros
 * where h_in is NULL). Writes n_vocab logits for each token with
 * b->logits[t] set (NULL: every token) in batch order to logits (NULL:
 * none), and each token's own hidden row (after the head norm: what a
 * chained guess feeds back) to h_out (NULL: none). */
kt_status llm_mtp_forward(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, const float *h_in,
                          float *logits, float *h_out, kt_error *err);

/* Only the K and V rows llm_mtp_forward would write for b's tokens (the
 * same bits): what the block's later rows attend. A row's K and V depend
 * on its own inputs alone (the block is one layer), so rows that only
 * keep the cache whole (every prompt and verified token's) skip the
 * attention, the FFN and the head: ~15% of the block. */
kt_status llm_mtp_kv(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, const float *h_in,
                     kt_error *err);

#endif
