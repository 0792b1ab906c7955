/*
 * cli_images.h - images for `kettle run` (--mmproj, --image): a prompt
 * with images evaluated into a session.
 *
 * The prompt text marks where each image goes with <__media__> (as
 * llama.cpp's tools do); without a marker the images come first. Each
 * image file is decoded and preprocessed (src/image/), encoded by the
 * vision tower (src/vision/) and evaluated between the model's
 * <|vision_start|> and <|vision_end|> tokens (kt_session_eval_image).
 */
#ifndef KT_CLI_CLI_IMAGES_H
#define KT_CLI_CLI_IMAGES_H

#include "kettle.h"
#include "vision/vision.h"

#define CLI_MAX_IMAGES 16
#define CLI_IMAGE_MARKER "<__media__>"

typedef struct cli_image_stats {
    int n_tokens;       /* the prompt's, images included */
    int n_image_tokens;
    double encode_ms;   /* the tower's time */
} cli_image_stats;

/* Evaluates text (bos as kt_tokenize) with the images at its markers into
 * s; logits gets the last position's. */
kt_status cli_images_eval(kt_model *m, kt_session *s, kt_vision *v, int n_threads, const char *const *paths,
                          int n_paths, const char *text, size_t len, int bos, float *logits, cli_image_stats *st,
                          kt_error *err);

#endif
