/*
 * chat.h - rendering an OpenAI-style message list with a model's chat
 * template (the Jinja text from tokenizer.chat_template / GGUF metadata).
 *
 * The variables the template sees are those transformers passes:
 * `messages`, `tools` (left undefined when NULL, as transformers does for
 * tools=None), `add_generation_prompt`, plus every key of `context`
 * (bos_token, eos_token, date_string, ...). Tool-call arguments must be
 * objects, not JSON strings (parse them before calling).
 */
#ifndef KT_TEXT_CHAT_H
#define KT_TEXT_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "kettle.h"

/* Returns malloc'ed text, or NULL with err set: a template error names the
 * template line; a template's own raise_exception() gives KT_ERR_ARG and
 * exactly its message. `tools` and `context` may be NULL. strftime_now()
 * reads the current local time. */
char *kt_chat_render(const char *template_text, const json_t *messages,
                     const json_t *tools, bool add_generation_prompt,
                     const json_t *context, kt_error *err);

/* Same, with strftime_now() fixed at `now` (seconds since the epoch, UTC;
 * 0 = current time), for reproducible output. */
char *kt_chat_render_at(const char *template_text, const json_t *messages,
                        const json_t *tools, bool add_generation_prompt,
                        const json_t *context, int64_t now, kt_error *err);

/* OpenAI clients send tool-call arguments as a JSON string; templates
 * index them as objects (`tool_call.arguments.city`). Replaces, in place,
 * every `tool_calls[].function.arguments` string that holds a JSON object
 * by that object; other values are left as they are. False when out of
 * memory (some arguments may be left as strings then). */
bool kt_chat_parse_tool_arguments(json_t *messages);

#endif
