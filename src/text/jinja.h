/*
 * jinja.h - a compact Jinja interpreter for chat templates.
 *
 * Renders the subset of Jinja that Hugging Face chat templates use, byte
 * for byte as jinja2 does when transformers configures it: trim_blocks and
 * lstrip_blocks on, break/continue, a `tojson` that keeps non-ASCII and
 * does not sort keys, `raise_exception(msg)` and `strftime_now(fmt)`.
 *
 *     kt_jinja *t = kt_jinja_parse(text, &err);
 *     char *out = kt_jinja_render(t, vars, NULL, &err);   // malloc'ed
 *     kt_jinja_free(t);
 *
 * Errors are values: a template that cannot be parsed or run fails with
 * "template line N: ..." naming the construct; one that refuses its input
 * with raise_exception fails with status KT_ERR_ARG and exactly the
 * template's message.
 */
#ifndef KT_TEXT_JINJA_H
#define KT_TEXT_JINJA_H

#include <jansson.h>
#include <stdint.h>

#include "kettle.h"

typedef struct kt_jinja kt_jinja;

typedef struct kt_jinja_options {
    /* Clock for strftime_now, seconds since the epoch (read as UTC);
     * 0 = the current local time. */
    int64_t now;
} kt_jinja_options;

/* Limits on a render, which a template from a downloaded GGUF is hostile
 * input to: each breach ends the render with KT_ERR_FORMAT and a message
 * naming the limit, never a hang or an exhausted machine. A real chat
 * template over a long conversation stays orders of magnitude below.
 *   STEPS   statements run plus expressions evaluated, a loop iteration
 *           counting as 16 (its loop object is that many values)
 *   MEMORY  bytes of values alive at once (the render's arena)
 *   OUTPUT  bytes of text written by one template or block (8 MiB is
 *           some 2M tokens, past any context; 32 MiB took seconds to
 *           write under the sanitizers, a slow unit when fuzzing)
 *   STRING  bytes of one string (a ~ b, a + b) and bytes or items of
 *           one repetition, 'x' * n; a filter over a string costs a
 *           step per KiB of it */
#define KT_JINJA_MAX_STEPS  1000000
#define KT_JINJA_MAX_MEMORY ((size_t)256 << 20)
#define KT_JINJA_MAX_OUTPUT ((size_t)8 << 20)
#define KT_JINJA_MAX_STRING ((size_t)16 << 20)

/* Parses a template; NULL with err set on a syntax error. */
kt_jinja *kt_jinja_parse(const char *text, kt_error *err);
void kt_jinja_free(kt_jinja *t);

/* Renders with `vars` (a JSON object; NULL = none) as the variables.
 * Returns malloc'ed UTF-8 text, or NULL with err set. `opts` may be NULL. */
char *kt_jinja_render(const kt_jinja *t, const json_t *vars,
                      const kt_jinja_options *opts, kt_error *err);

#endif
