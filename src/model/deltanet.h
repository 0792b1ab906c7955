/*
 * deltanet.h - Qwen 3.5's Gated DeltaNet layer (llama.cpp's qwen35.cpp,
 * ggml_gated_delta_net), in its recurrent form: one state update per
 * token, for prefill too (deltanet.c says why).
 */
#ifndef KT_MODEL_DELTANET_H
#define KT_MODEL_DELTANET_H

#include "kv/block_pool.h"
#include "model/model.h"
#include "ops/pool.h"

/* Scratch for a chunk of up to n_max tokens. */
typedef struct llm_dn_work {
    float *qkv;   /* [n][conv_dim]: projections, then the convolution's output */
    float *z;     /* [n][H_v d_v]: the output gate */
    float *beta;  /* [n][H_v] */
    float *alpha; /* [n][H_v] */
    float *o;     /* [n][H_v d_v] */
} llm_dn_work;

kt_status llm_dn_work_init(llm_dn_work *dw, const llm_config *c, int n_max, kt_error *err);
void llm_dn_work_free(llm_dn_work *dw);

/* What a recurrent layer's update of each token of a chunk touches
 * besides its sequence's state (kv_seq.state), indexed by the chunk's
 * tokens; an array NULL: nothing for any token, an entry NULL: nothing
 * for that token. Each buffer has a whole slot's layout (llm_state_bytes). */
typedef struct llm_rec_io {
    float *const *snap; /* copy the state as it stands after the token here (prefix-cache snapshots) */
    float *const *log;  /* log what the update reads here (llm_rec_log_floats; a speculative rollback) */
    /* read the state before the token from / write the state after it to
     * these instead of kv_seq.state: a verify pass's tokens move the state
     * on in the slot's spare, and the state before them stays untouched */
    float *const *from, *const *to;
} llm_rec_io;

/* Layer l (recurrent) over n tokens: xn holds their norm(x) rows
 * [n][n_embd] and gets the layer's output. Token t belongs to seqs[t]
 * and moves that sequence's state on by one position (io: where it reads
 * and writes it, and what else it leaves): a sequence's tokens come in
 * position order, each right after the positions its state holds. */
void llm_deltanet_block(const llm_model *m, const llm_layer *l, kt_pool *pool, float *xn, kv_seq *const *seqs,
                        const llm_rec_io *io, int n, llm_dn_work *dw);

/* Speculative rollback: log (NULL: none) names, per token, where the
 * layer keeps what the token's state update read (its projections qkv,
 * beta and alpha, llm_rec_log_floats in all for every recurrent layer);
 * llm_deltanet_replay moves seq's state on by n logged tokens, the
 * convolution and the delta rule as the block ran them (the same bits),
 * without the layer's output. */
size_t llm_rec_log_floats(const llm_config *c);
void llm_deltanet_replay(const llm_model *m, const llm_layer *l, kt_pool *pool, kv_seq *seq, const float *const *log,
                         int n, llm_dn_work *dw);

#endif
