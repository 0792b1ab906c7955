/*
 * format_int.h - a family's row of the tool-call table (tool_format.c),
 * shared by the parser, the grammar builder and the message preparation.
 *
 * Strings are literal text the model writes; "" means the family has no
 * such marker. A call, in each shape:
 *
 *   [section_open] call_open BODY call_close [call_sep call_open BODY ...]
 *   [section_close]
 *
 *   JSON:      BODY = {"<name_key>": "NAME", "<args_key>": ARGS}
 *              (call_open may be empty: the object itself starts the call,
 *              `json_list`: the section is a JSON array of such objects)
 *   NAME_ARGS: BODY = NAME name_end ARGS        (ARGS a JSON object)
 *   XML:       BODY = name_open NAME name_end (key_open KEY key_close
 *              value_open VALUE value_close)* fn_close
 *   (functionary v3.2: reply_open `>>>`, NAME_ARGS with name_end "\n",
 *   and the segment named `all` is text: ">>>all\nHi>>>f\n{...}")
 *   HARMONY:   gpt-oss's channels: <|channel|>analysis<|message|>...<|end|>,
 *              <|channel|>commentary to=functions.NAME ...<|message|>ARGS,
 *              <|channel|>final<|message|>... (parsed by its own states)
 */
#ifndef KT_TOOLCALL_FORMAT_INT_H
#define KT_TOOLCALL_FORMAT_INT_H

#include <jansson.h>
#include <stdbool.h>

#include "toolcall/toolcall.h"

typedef enum tc_shape { SHAPE_JSON, SHAPE_NAME_ARGS, SHAPE_XML, SHAPE_HARMONY } tc_shape;

typedef enum tc_ids { IDS_OPENAI, IDS_MISTRAL9 } tc_ids;

struct kt_tool_format {
    const char *name;
    const char *detect[3];    /* all must occur in the template */
    const char *unless;       /* must not occur ("" none) */
    tc_shape shape;
    const char *think_open, *think_close;
    const char *think_var;    /* thinking is opt-in through this template variable ("" or NULL: on by default) */
    const char *section_open, *section_close;
    const char *call_open, *call_open2; /* call_open2: another opener ("" none) */
    const char *call_close, *call_sep;
    bool json_list;           /* JSON: the section is a JSON array of calls */
    const char *name_key, *args_key;
    const char *name_open, *name_end;
    const char *key_open, *key_close, *value_open, *value_close, *fn_close;
    const char *strip[3];     /* markers dropped from content */
    bool special_text;        /* markers are control tokens */
    tc_ids ids;
    bool one_call;            /* the family writes one call per reply */
    const char *reply_open;   /* the generation prompt ends with this call opener, so the reply
                                 starts inside a call (functionary v3.2's `>>>`) */
    const char *text_name;    /* a "call" of this name is the answer's text (v3.2's `>>>all`) */
    const char *builtin_var;  /* the template variable listing the built-in tools the model calls
                                 in Python after call_open2 (Llama 3.1's builtin_tools, below) */
    /* The grammar (tool_grammar.c): what the model writes from `trigger`
     * on. g_call is one call: %n its name, %a its arguments (JSON), %p
     * its XML parameters (each g_param: %k key, %v value), %i an index.
     * Several calls: g_start call (g_more call)* g_end, or, when g_more is
     * NULL, one call per trigger. g_call may start with the trigger's
     * text (Llama 3's `{"name"`): the trigger is then part of the call. */
    const char *trigger, *trigger2;
    const char *g_call, *g_param, *g_start, *g_more, *g_end;
    const char *g_think_open, *g_think_close; /* default: think_open / think_close */
};

/* The tool of `tools` (OpenAI tool objects) whose function is named
 * name[0..len), or NULL. */
const json_t *tc_find_tool(const json_t *tools, const char *name, size_t len);

/* Llama 3.1's built-in tools, called as Python after <|python_tag|>:
 *   brave_search.call(query="...")    (and wolfram_alpha)
 *   print(1 + 1)                      (code for code_interpreter)
 * An offered function of such a name is called that way; `python` and
 * `code_interpreter` take the code (as their one string parameter). */
bool tc_is_builtin_call(const char *name); /* brave_search, wolfram_alpha */
bool tc_is_code_tool(const char *name);    /* python, code_interpreter */
/* The code tool offered in `tools` (its name, and the name of its one
 * string parameter, "code" if it has no single one), or NULL. */
const char *tc_code_tool(const json_t *tools, const char **param);

/* Text written between the thinking block and what follows, as the
 * grammar allows it. */
#define TC_WS "[ \\t\\n]{0,4}"

#endif
