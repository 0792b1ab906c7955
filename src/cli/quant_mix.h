/*
 * quant_mix.h - the type each tensor of a model gets in one of `kettle
 * quantize`'s types or llama.cpp's mixes (Q4_K_M, MXFP4_MOE, ...), and the
 * order llama.cpp writes tensors in: one rule set that `kettle quantize`
 * (converting a file) and `kettle gen-model` (writing random weights
 * straight into a mix) both read, so a generated file equals the one
 * quantize would write from the same weights in F32.
 */
#ifndef KETTLE_CLI_QUANT_MIX_H
#define KETTLE_CLI_QUANT_MIX_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "ops/quant.h"

/* What to write: a base type, whether llama.cpp's mix rules apply, and the
 * general.file_type (LLAMA_FTYPE) to record. */
typedef struct quant_recipe {
    kt_dtype base;
    bool mix;
    uint32_t ftype;
} quant_recipe;

/* The hyper-parameters the mix rules read (from the GGUF keys
 * <arch>.block_count, attention.head_count(_kv), expert_count; where a
 * file has none: 0 layers and experts, 1 head, n_head_kv = n_head). */
typedef struct quant_hparams {
    char arch[64];
    int64_t n_layer, n_head, n_head_kv, n_expert;
} quant_hparams;

/* TYPE: a plain type (cli_parse_out_type's, or a K-quant as --pure
 * writes it) or one of llama.cpp's mixes; false if unknown. */
bool quant_recipe_parse(const char *name, quant_recipe *r);
/* Whether name is one of the mixes (MXFP4_MOE, Q4_K_M, ...). */
bool quant_recipe_is_mix(const char *name);

/* Indices of the n tensors in llama.cpp's order (by the layer number of
 * "blk.N.", other tensors first, then by name); NULL if out of memory. */
int64_t *quant_tensor_order(const gguf_tensor *t, int64_t n);

/* The output type of every tensor (indexed as t; only name, n_dims, dims
 * and type are read), decided in order; n_fallback[0] counts the K-quant
 * tensors written in their fallback type, n_fallback[1] those written in
 * F16 because no block fits their rows. NULL if out of memory. */
kt_dtype *quant_plan_types(const gguf_tensor *t, int64_t n, const int64_t *order,
                           const quant_recipe *r, const quant_hparams *hp, int n_fallback[2]);

#endif
