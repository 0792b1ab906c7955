/*
 * cli_images.h - images for `kettle run` and `kettle chat` (--mmproj,
 * --image): image files encoded by the vision tower and evaluated into a
 * session.
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

/* One encoded image file. */
typedef struct cli_image {
    uint64_t hash;       /* of the file's bytes: what the image is known by */
    float *embd;         /* grid_x * grid_y rows of the text model's n_embd (* (1 + n_deepstack): Qwen3-VL) */
    int grid_x, grid_y;  /* merged tokens across and down */
    int width, height;   /* the file's pixels, upright */
} cli_image;

/* The tower at path, checked against the text model it feeds
 * (kt_vision_check_text): its output width must be the model's n_embd,
 * and its DeepStack outputs (Qwen3-VL) as many as the model's DeepStack
 * layers (a qwen3vl / qwen3vlmoe model; none for any other). NULL with
 * err set. */
kt_vision *cli_vision_load(const char *path, const kt_model *m, kt_error *err);

/* Decodes, preprocesses and encodes the image file at path into im.
 * *ms adds the tower's time. */
kt_status cli_image_encode(kt_vision *v, kt_pool *pool, const char *path, cli_image *im, double *ms, kt_error *err);
void cli_image_free(cli_image *im);

/* The marker at or after text[0, len), or NULL. */
const char *cli_find_marker(const char *text, size_t len);

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
