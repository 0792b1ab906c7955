/*
 * model_internal.h - what a kt_model is, for the files of engine/ that
 * run it (api.c loads it; engine.c drives its forward pass). Nothing
 * outside engine/ sees this: the rest of the program uses kettle.h.
 */
#ifndef KT_ENGINE_MODEL_INTERNAL_H
#define KT_ENGINE_MODEL_INTERNAL_H

#include "gguf/gguf.h"
#include "kettle.h"
#include "kv/block_pool.h"
#include "model/forward.h"
#include "model/model.h"
#include "ops/pool.h"
#include "text/vocab.h"
#include "engine/images.h"
#include "engine/rewind.h"

#define KT_MAX_EOG 16

struct kt_model {
    gguf_file *file;
    llm_model *llm;
    kt_vocab *vocab;
    kt_model_desc desc;
    char *chat_template; /* NULL if the file has none */
    int32_t eog[KT_MAX_EOG]; /* tokens that end a turn */
    int n_eog;
    int n_repacked; /* matrices repacked at load (KT_LOAD_REPACK) */
};

/* One sequence on a pool of one block of n_ctx positions (api.c;
 * session_file.c saves and restores it). */
struct kt_session {
    kt_model *model;
    kv_pool *kv;
    kv_seq *seq;
    llm_work *work;
    kt_pool *pool;
    int n_ctx;
    req_images images; /* the images in the sequence (kt_session_eval_image): their positions' layout */
    /* kt_session_params.mtp: every pass also runs the MTP block (its KV in
     * the pool's last layer), row p on x_p and the target's h_{p-1}, as
     * llama.cpp's draft-mtp does after each target batch. mtp_h: the
     * target's hidden state at position len - 1 (zeros at 0 or where it
     * is not known); mtp_rows: the last pass's tokens' hidden states, from
     * position mtp_base, mtp_n of them (a rollback within that pass finds
     * its h there); mtp_in: the MTP's input rows. */
    bool mtp;
    float *mtp_h, *mtp_rows, *mtp_in;
    int mtp_base, mtp_n;
    /* a hybrid model's speculative rollback (engine/session_spec.c),
     * made at its first use */
    eng_rewind *rw;
    int spec_len0, spec_n; /* the last kt_session_spec_eval: the length before it, its tokens */
};

/* Tokens [0, n) (or embedding rows) appended and run, as kt_session_eval
 * does; rw (NULL: none): a verify pass of n <= LLM_MAX_BATCH tokens that
 * rw planned, which may be rolled back (engine/rewind.h). */
kt_status kt_session_forward(kt_session *s, const int32_t *tokens, const float *embd, int n, float *logits,
                             bool all_logits, eng_rewind *rw, kt_error *err);
/* Sets mtp_h to the hidden state after n_keep positions, where the last
 * pass holds it (zeros otherwise). */
void kt_session_mtp_cut(kt_session *s, int n_keep);

/* Speculation on a session (engine/session_spec.c), any model, hybrid
 * ones included: kt_session_spec_eval runs tokens[0..n) with logits for
 * every one, ready to be cut back; kt_session_spec_keep then keeps `keep`
 * of them (1..n): the KV and, on a hybrid model, the recurrent state
 * exactly as if only those had been run. */
kt_status kt_session_spec_eval(kt_session *s, const int32_t *tokens, int n, float *logits, kt_error *err);
kt_status kt_session_spec_keep(kt_session *s, int keep, kt_error *err);
/* The MTP block's k greedy guesses of what follows `pending` (sampled,
 * not yet run; the session must have been made with mtp): pending at
 * position len with the target's h_{len-1}, then each guess at the next
 * position on the MTP's own hidden state. The session is left as it was
 * (the guesses' MTP rows are past its length, overwritten by the verify
 * pass). Returns k, or -1 with err. */
int kt_session_mtp_draft(kt_session *s, int32_t pending, int k, int32_t *out, kt_error *err);

/* What the KV a model computes depends on, hashed: every tensor's name,
 * type and shape, samples of its data as loaded (so two files of the same
 * shapes with other weights differ, and so do a repacked and a mapped
 * load of F16, which sum in other orders), the KV element type, the
 * block size, and which of Phi-3's LongRoPE factor sets a context of
 * n_ctx positions turns by. Names the disk tier's directory and goes in
 * its files. */
uint64_t kt_model_kv_fingerprint(const kt_model *m, int kv_type, int block_tokens, int n_ctx);

#endif
