/*
 * chat_images.h - the images of a `kettle chat` conversation.
 *
 * A user message with images keeps their files in an "images" array of
 * paths beside its content, which holds a <__media__> marker where each
 * goes (so /save and --session keep them). Each file is encoded once by
 * the vision tower and kept by path for the rest of the chat. A rendered
 * prompt is tokenized between the markers; each marker becomes the
 * model's <|vision_start|>, one entry per merged patch group and
 * <|vision_end|>. Those entries hold key ids (negative, from the file's
 * hash and the entry's index) rather than vocabulary ids, so the chat's
 * longest-common-prefix reuse compares images by content like text.
 */
#ifndef KT_CLI_CHAT_IMAGES_H
#define KT_CLI_CHAT_IMAGES_H

#include <jansson.h>

#include "cli/cli_images.h"
#include "kettle.h"

typedef struct chat_images chat_images;

/* An image's entries in a tokenized prompt: [at, at + n). */
typedef struct chat_span {
    int at, n;
    const cli_image *im;
} chat_span;

chat_images *chat_images_new(kt_vision *v, int n_threads, kt_error *err);
void chat_images_free(chat_images *ci);

/* The image at path, encoded now unless it already was. NULL with err set. */
const cli_image *chat_images_get(chat_images *ci, const char *path, kt_error *err);

/* The tower's time so far, in ms (a turn reports what it added). */
double chat_images_encode_ms(const chat_images *ci);

/* Tokenizes a rendered prompt whose markers stand for the images of
 * `messages` ("images" arrays, in order): *toks (n entries, malloc'ed)
 * and *spans (*n_spans, malloc'ed). add_bos as kt_tokenize_ex. Returns
 * the number of entries, or -1 with err set (a marker without its image,
 * or an image whose marker the template dropped, is an error). */
int chat_images_tokenize(chat_images *ci, kt_model *m, const char *text, int add_bos, json_t *messages,
                         int32_t **toks, chat_span **spans, int *n_spans, kt_error *err);

#endif
