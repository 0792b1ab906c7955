/*
 * vision.h - vision towers: the mmproj file and the image encoder.
 *
 * A vision-language model ships as a text model plus an `mmproj` GGUF
 * (llama.cpp's clip format: arch `clip`, `clip.vision.*` keys, `v.*` and
 * `mm.*` tensors). The tower turns a preprocessed image (src/image/) into
 * one embedding per merged 2x2 patch group, in the text model's embedding
 * space, which the engine places at the image's tokens. Projector types:
 * `qwen3vl_merger` (Qwen 3.5 and Qwen3-VL, DeepStack where the file has
 * it), `qwen2.5vl_merger` (window attention), `qwen2vl_merger`; any other
 * is refused naming it. The GEMMs are the forward pass's kernels
 * (kt_matmul), batched over all patches and the pool's threads.
 */
#ifndef KT_VISION_VISION_H
#define KT_VISION_VISION_H

#include <stdbool.h>

#include "image/image.h"
#include "kettle.h"
#include "ops/pool.h"

typedef struct kt_vision kt_vision;

typedef struct kt_vision_info {
    char projector[32]; /* "qwen3vl_merger", "qwen2.5vl_merger", "qwen2vl_merger" */
    int n_embd;         /* output width per merged token: the text model's n_embd */
    int n_deepstack;    /* DeepStack outputs after the main one (0 for Qwen 3.5) */
    int n_layers, width, n_heads;
    int64_t n_params;
} kt_vision_info;

kt_vision *kt_vision_load(const char *mmproj_path, kt_error *err);
void kt_vision_free(kt_vision *v);

const kt_vision_info *kt_vision_get_info(const kt_vision *v);
/* Whether its GEMMs and attention run on AMX tiles (chosen at load where
 * the CPU has AMX-BF16: ops/amx.h). */
bool kt_vision_uses_amx(const kt_vision *v);

/* Whether the tower feeds a text model of this architecture, embedding
 * width and DeepStack layers (kt_model_desc's): the widths must be equal,
 * and DeepStack outputs go only to a qwen3vl / qwen3vlmoe model with as
 * many DeepStack layers (n_deepstack_layers). KT_OK, or an error that
 * says which. */
kt_status kt_vision_check_text(const kt_vision_info *vi, const char *arch, int n_embd, int n_deepstack,
                               kt_error *err);

/* The preprocessing this tower wants (patch, merge, min / max pixels as
 * llama.cpp sets them for the projector, mean / std from the file). */
void kt_vision_prep_params(const kt_vision *v, kt_image_prep_params *p);

/* Encodes one preprocessed image: embd gets grid_x * grid_y rows (row-major
 * over the merged grid) of n_embd * (1 + n_deepstack) floats (the main
 * embedding, then each DeepStack output). pool may be NULL. */
kt_status kt_vision_encode(kt_vision *v, kt_pool *pool, const kt_image_prep *img, float *embd,
                           kt_error *err);

#endif
