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
};

/* What the KV a model computes depends on, hashed: every tensor's name,
 * type and shape, samples of its data as loaded (so two files of the same
 * shapes with other weights differ, and so do a repacked and a mapped
 * load of F16, which sum in other orders), the KV element type, the
 * block size, and which of Phi-3's LongRoPE factor sets a context of
 * n_ctx positions turns by. Names the disk tier's directory and goes in
 * its files. */
uint64_t kt_model_kv_fingerprint(const kt_model *m, int kv_type, int block_tokens, int n_ctx);

#endif
