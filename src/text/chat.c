/*
 * chat.c - chat template rendering on top of the Jinja interpreter: builds
 * the variables transformers' apply_chat_template passes and renders.
 */
#include "text/chat.h"

#include "base/error.h"
#include "base/json_safe.h"
#include "text/jinja.h"

static json_t *chat_vars(const json_t *messages, const json_t *tools,
                         bool add_generation_prompt, const json_t *context,
                         kt_error *err) {
    if (!json_is_array(messages)) {
        kt_error_set(err, KT_ERR_ARG, "chat: messages must be a JSON array");
        return NULL;
    }
    if (context && !json_is_object(context)) {
        kt_error_set(err, KT_ERR_ARG, "chat: context must be a JSON object");
        return NULL;
    }
    json_t *vars = json_object();
    if (!vars || (context && json_object_update(vars, (json_t *)context)) ||
        json_object_set(vars, "messages", (json_t *)messages) ||
        (tools && json_object_set(vars, "tools", (json_t *)tools)) ||
        json_object_set_new(vars, "add_generation_prompt",
                            json_boolean(add_generation_prompt))) {
        json_decref(vars);
        kt_error_set(err, KT_ERR_NOMEM, "chat: out of memory");
        return NULL;
    }
    return vars;
}

char *kt_chat_render_at(const char *template_text, const json_t *messages,
                        const json_t *tools, bool add_generation_prompt,
                        const json_t *context, int64_t now, kt_error *err) {
    json_t *vars = chat_vars(messages, tools, add_generation_prompt, context, err);
    if (!vars) return NULL;
    char *out = NULL;
    kt_jinja *t = kt_jinja_parse(template_text, err);
    if (t) {
        kt_jinja_options opts = {.now = now};
        out = kt_jinja_render(t, vars, &opts, err);
        kt_jinja_free(t);
    }
    json_decref(vars);
    return out;
}

char *kt_chat_render(const char *template_text, const json_t *messages,
                     const json_t *tools, bool add_generation_prompt,
                     const json_t *context, kt_error *err) {
    return kt_chat_render_at(template_text, messages, tools,
                             add_generation_prompt, context, 0, err);
}

bool kt_chat_parse_tool_arguments(json_t *messages) {
    size_t i, j;
    json_t *msg, *call;
    json_array_foreach(messages, i, msg) {
        json_array_foreach(json_object_get(msg, "tool_calls"), j, call) {
            json_t *fn = json_object_get(call, "function");
            const char *args = json_string_value(json_object_get(fn, "arguments"));
            json_error_t je;
            json_t *parsed = args ? kt_json_loads(args, 0, &je) : NULL;
            /* out of memory is not "not JSON": the template would see a string */
            if (args && !parsed && json_error_code(&je) == json_error_out_of_memory) return false;
            if (json_is_object(parsed) && json_object_set_new(fn, "arguments", parsed)) return false;
            if (!json_is_object(parsed)) json_decref(parsed);
        }
    }
    return true;
}
