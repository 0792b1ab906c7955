/*
 * model_internal.h - what a kt_model is, for the files of engine/ that
 * run it (api.c loads it; engine.c drives its forward pass). Nothing
 * outside engine/ sees this: the rest of the program uses kettle.h.
 */
#ifndef KT_ENGINE_MODEL_INTERNAL_H
#define KT_ENGINE_MODEL_INTERNAL_H

#include "gguf/gguf.h"
#include "kettle.h"
#include "model/model.h"
#include "text/vocab.h"

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

#endif
