/*
 * deltanet.h - Qwen 3.5's Gated DeltaNet layer (llama.cpp's qwen35.cpp,
 * ggml_gated_delta_net), in its recurrent form: one state update per
 * token, for prefill too (the chunked WY form is a later step).
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

/* Layer l (recurrent) over n tokens: xn holds their norm(x) rows
 * [n][n_embd] and gets the layer's output. Token t belongs to seqs[t]
 * and moves that sequence's state (kv_seq.state) on by one position:
 * a sequence's tokens come in position order, each right after the
 * positions its state holds. */
void llm_deltanet_block(const llm_model *m, const llm_layer *l, kt_pool *pool, float *xn, kv_seq *const *seqs, int n,
                        llm_dn_work *dw);

#endif
