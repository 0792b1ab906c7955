/*
 * forward.h - the forward pass over a ragged batch of tokens from any
 * number of sequences, with KV in the paged block pool (kv/block_pool.h).
 *
 * A batch is a list of tokens, each with its sequence (a kv_seq: the block
 * table its K and V rows go to and are read from) and its position in that
 * sequence. Every matmul runs over the whole batch (a GEMM: each weight is
 * read once per chunk of up to LLM_MAX_BATCH tokens, however many
 * sequences they come from); attention reads each token's own sequence
 * through its block table. A token's results depend only on its own
 * sequence, never on the others in the batch (batch invariance: the
 * kernels' reduction orders are per row), so the engine may mix decode
 * tokens and prefill chunks freely.
 *
 * Rules the caller keeps (the engine and kt_session do):
 *   - each token's position is < its sequence's len: the blocks exist
 *     (kv_seq_append) and are private (copy-on-write already done);
 *   - the tokens of one sequence appear in the batch in position order,
 *     and every position before a token's is already in the cache or
 *     earlier in the batch; a token attends positions [0, pos].
 */
#ifndef KT_MODEL_FORWARD_H
#define KT_MODEL_FORWARD_H

#include <stdbool.h>

#include "kv/block_pool.h"
#include "model/model.h"
#include "ops/pool.h"

#define LLM_MAX_BATCH 256

typedef struct llm_batch {
    int n_tokens;
    const int32_t *tokens; /* ids < n_vocab */
    const int *pos;        /* each token's position in its sequence */
    kv_seq *const *seq;    /* each token's sequence, all on one pool */
    const bool *logits;    /* which tokens want logits; NULL: none */
    /* which tokens want their last hidden state instead (embeddings): the
     * output norm of the last layer's output, n_embd floats each, written
     * one after another in batch order to hidden_out; NULL: none. A token
     * may want both (the MTP head reads the target's hidden state beside
     * its logits). */
    const bool *hidden;
    float *hidden_out;
    /* M-RoPE (models with rope.dimension_sections: Qwen 3.5): each token's
     * position as 4 components (t, h, w, e), 4 ints a token; NULL: text,
     * whose token at pos p is (p, p, p, 0), i.e. plain rope at p. The
     * vision issue fills these in for image tokens. */
    const int *pos_mrope;
    /* hybrid models: per token, NULL or where to copy its sequence's
     * recurrent state as it stands after that token (llm_state_bytes,
     * a slot's layout); NULL: none. The prefix cache's snapshots. */
    float *const *state_snap;
    /* hybrid models: per token, NULL or where to log what its recurrent
     * layers' state updates read (llm_rec_log_floats, model/deltanet.h),
     * so a speculative rollback can replay the tokens it keeps. */
    float *const *rec_log;
    /* hybrid models: per token, NULL or the buffer its recurrent layers
     * read the state before it from (rec_from) and write the state after
     * it to (rec_to) instead of its sequence's state; NULL: none. A verify
     * pass moves a sequence's state on in its slot's spare, so the state
     * before the pass stays (model/deltanet.h llm_rec_io). */
    float *const *rec_from, *const *rec_to;
    /* per token, NULL or the n_embd floats that stand for it instead of
     * its token's embedding row (an image's embeddings, src/vision/),
     * followed by n_deepstack more slices of n_embd in Qwen3-VL models
     * (llm_embd_row_floats, model/deepstack.h); NULL: every token is its id. */
    const float *const *embd;
} llm_batch;

/* Scratch activations for one chunk; one per thread that runs forwards. */
typedef struct llm_work llm_work;

/* n_ctx: the context the forwards will run in (positions per sequence),
 * which picks Phi-3's LongRoPE factors as llama.cpp does. */
llm_work *llm_work_new(const llm_model *m, int n_ctx, kt_error *err);
void llm_work_free(llm_work *w);

/* The pool parameters that fit model m: kv_dim, n_layer and the
 * sliding-window layers from its config (with as many window slots as
 * blocks: a caller that wants the window layers' memory back sets
 * n_window_blocks lower), the rest from the arguments. */
kv_pool_params llm_kv_params(const llm_model *m, int n_blocks, int block_tokens, kv_type type);

/* The cache element type asked for (KT_KV_DEFAULT: dflt) as the pool's
 * type, or KT_ERR_ARG with a message where model m cannot keep it (Q8_0
 * needs a head size that is a multiple of 32). */
kt_status llm_kv_type(const llm_model *m, kt_kv_type asked, kv_type dflt, kv_type *out, kt_error *err);

/* Runs the batch, writing each token's K and V rows into its sequence's
 * blocks, and n_vocab logits for each token with logits[t] set, one after
 * another in batch order, into `logits`. */
/* Moves seq's recurrent state on by n tokens logged by a forward
 * (llm_batch.rec_log), exactly as that forward did: a speculative
 * rollback restores the state from before the pass and replays the
 * tokens it keeps. */
void llm_state_replay(const llm_model *m, llm_work *w, kt_pool *pool, kv_seq *seq, const float *const *log, int n);
void llm_forward(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                 float *logits);

/* One decoder block outside the trunk (the MTP head's, model/mtp.c):
 * b's n_tokens (<= LLM_MAX_BATCH; tokens unused) with their residual rows
 * x (n x n_embd) through layer il (m->layers[il]: its attention, its K and
 * V into its kv_layer, its FFN), then out_norm: those rows to h_out. */
void llm_forward_block(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, int il, const float *x,
                       const llm_tensor *out_norm, float *h_out);
/* Only the K and V rows of llm_forward_block (the same bits): for rows
 * whose output nothing reads, only whose cache rows later tokens attend. */
void llm_forward_block_kv(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, int il,
                          const float *x);

#endif
