/*
 * toolcall.h - tool calls and reasoning in each model family's own
 * syntax: which family a chat template belongs to, the grammar that keeps
 * a call valid, the parser that turns the model's text back into OpenAI's
 * message (content, reasoning_content, tool_calls), and the adaptations a
 * conversation needs before a template renders it.
 *
 * Every family is one row of a table (tool_format.c): its markers, the
 * shape of a call between them, its thinking markers. Three call shapes
 * cover the families agents run:
 *
 *   JSON       an object naming the function and holding its arguments
 *              (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
 *              Llama 3.x, Mistral Nemo's and Granite's JSON lists,
 *              Command-R7B's actions)
 *   NAME_ARGS  the name, a marker, the arguments as JSON (Mistral Small
 *              3.2 / Devstral, DeepSeek R1 and V3.1, Kimi-K2,
 *              functionary v3.1, gpt-oss's harmony headers)
 *   XML        the name, then one element per argument (Qwen3-Coder,
 *              GLM-4.5 / 4.6), converted to JSON by the parameter schema
 *
 * The parser is incremental: text goes in as it is generated and comes
 * out as deltas (content, reasoning, the start of a call with its id and
 * whole name, pieces of its arguments that only ever append). A marker is
 * never output as content: text that could be the start of one is held
 * back until it is known not to be. The non-streamed answer is the same
 * deltas gathered, so the two always agree.
 *
 * The grammar (GBNF over the text after a trigger, see engine.h's lazy
 * grammars) is built from the tools' parameter schemas with kettle's JSON
 * Schema converter: under `auto` the engine starts it when the model
 * writes the family's trigger, so free text stays free and every call is
 * still valid; under `required` or a named function the whole reply is
 * constrained to (thinking, then) a call.
 */
#ifndef KT_TOOLCALL_H
#define KT_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kettle.h"

typedef struct kt_tool_format kt_tool_format;

/* Where the prompt leaves the family's thinking block. */
typedef enum kt_tool_think {
    KT_THINK_MAYBE = 0, /* the model may open one */
    KT_THINK_OPEN,      /* the prompt opened it (DeepSeek R1, QwQ): the reply starts inside */
    KT_THINK_DONE,      /* the prompt closed it (Qwen 3 with enable_thinking false) */
} kt_tool_think;

/* The family of a chat template (its text), or the generic format when
 * none matches (then tools go in a system message and calls are
 * `<tool_call>` JSON, see kt_tool_prepare). Never NULL. */
const kt_tool_format *kt_tool_format_detect(const char *template_text);
/* The family by its name ("hermes", "llama3", ...), or NULL. */
const kt_tool_format *kt_tool_format_by_name(const char *name);
const char *kt_tool_format_name(const kt_tool_format *f);
/* Every family's name, comma-separated (documentation, errors). */
const char *kt_tool_format_names(void);
/* The format's markers are control tokens: the engine must show them as
 * text (kt_gen_params.special_text) for the parser and grammar to see. */
bool kt_tool_format_special_text(const kt_tool_format *f);
/* The template variable that turns the family's thinking on (Granite's
 * "thinking"), or NULL when its models think unless told not to. */
const char *kt_tool_format_think_var(const kt_tool_format *f);
/* The family's thinking markers (NULL when it has none). */
const char *kt_tool_format_think_open(const kt_tool_format *f);
const char *kt_tool_format_think_close(const kt_tool_format *f);

/* ---- the conversation, before rendering ---- */

/* A copy of `messages` ready for the template: tool-call arguments as the
 * template wants them (objects, or the JSON strings some templates
 * concatenate), an assistant's null content as "", ids in the family's
 * form (Mistral's 9 alphanumerics), and for a template with no place for
 * tools (`template_has_tools` false), tools described in the system
 * message, calls written back as the generic format's text and tool
 * results as user messages. *tools_out is the tools to pass to the
 * template (NULL when they went into the messages). NULL with err on a
 * malformed message or out of memory. */
json_t *kt_tool_prepare(const kt_tool_format *f, const char *template_text, const json_t *messages,
                        const json_t *tools, bool arguments_as_strings, json_t **tools_out, kt_error *err);
/* The conversation rendered by the template (Jinja text) for a reply:
 * kt_tool_prepare's copy as sent, then with an empty description on every
 * function and parameter that has none (templates that print them
 * unconditionally), then with late system messages merged into the first
 * and then folded into the first user turn (templates that refuse the
 * system role); each with arguments as objects or, when the template
 * fails on those, as the JSON strings some templates concatenate; the
 * first failure is the one reported. `vars`: the template's variables
 * (bos_token, ..., chat_template_kwargs); `now` as kt_chat_render_at. */
char *kt_tool_render(const kt_tool_format *f, const char *template_text, const json_t *messages, const json_t *tools,
                     const json_t *vars, int64_t now, kt_error *err);
/* Where the rendered prompt leaves f's thinking block. */
kt_tool_think kt_tool_think_state(const kt_tool_format *f, const char *prompt);
/* Whether the template text mentions tools at all. */
bool kt_tool_template_has_tools(const char *template_text);

/* ---- the grammar ---- */

typedef enum kt_tool_choice {
    KT_TOOL_AUTO = 0, /* the model decides; a call is constrained once it starts */
    KT_TOOL_NONE,     /* no call: the reply is text */
    KT_TOOL_REQUIRED, /* at least one call, of any offered function */
    KT_TOOL_NAMED,    /* exactly the named function */
} kt_tool_choice;

#define KT_TOOL_MAX_TRIGGERS 3


/* What the engine needs to keep calls valid. All strings malloc'ed. */
typedef struct kt_tool_grammar {
    char *grammar;                            /* whole reply (required / named); NULL under auto */
    char *triggers[KT_TOOL_MAX_TRIGGERS];     /* text that starts a call */
    char *trigger_grammars[KT_TOOL_MAX_TRIGGERS]; /* what follows that text */
    int n_triggers;
    int max_calls;   /* constrained segments before the reply ends (1: the
                        grammar's body holds every call) */
    bool special_text;
    /* What of the parameter schemas is enforced only in part ("tool 'T':
     * at POINTER: what", joined by "; "; "" when all is): count bounds past
     * the grammar's limit, and string keywords the raw-text arguments of
     * the XML families cannot carry. The client checks the arguments it
     * gets anyway; the server says this back (x-kettle-warning). */
    char relaxed[512];
} kt_tool_grammar;

/* The id of the control token whose text is s[0..n), or -1 (markers that
 * are control tokens go into the grammar as token references). */
typedef int32_t (*kt_tool_control_id)(void *ctx, const char *s, size_t n);

/* Builds the grammar for `tools` (OpenAI tool objects) under `choice`
 * (`name`: the named function). `think`: where the prompt left the
 * family's thinking block. `content_gbnf` (may be NULL): under auto,
 * the grammar a text answer must match instead of a call (a
 * response_format). `control_id` may be NULL (every marker is text). A
 * parameter schema kettle cannot enforce is KT_ERR_UNSUPPORTED naming the
 * tool and the keyword; one it can enforce only in part is enforced that
 * far and said in out->relaxed. */
kt_status kt_tool_grammar_build(const kt_tool_format *f, const json_t *tools, kt_tool_choice choice,
                                const char *name, bool parallel, kt_tool_think think, const char *content_gbnf,
                                kt_tool_control_id control_id, void *ctx, kt_tool_grammar *out, kt_error *err);
void kt_tool_grammar_free(kt_tool_grammar *g);

/* ---- the parser ---- */

typedef enum kt_tool_delta_kind {
    KT_TD_CONTENT,    /* text of the answer */
    KT_TD_REASONING,  /* text inside the thinking markers */
    KT_TD_CALL,       /* a call starts: index, id, name (whole) */
    KT_TD_ARGS,       /* more of call `index`'s arguments (JSON text) */
} kt_tool_delta_kind;

typedef struct kt_tool_delta {
    kt_tool_delta_kind kind;
    int index;          /* KT_TD_CALL / KT_TD_ARGS: the call's index */
    const char *text;   /* content, reasoning, name or arguments */
    size_t len;
    const char *id;     /* KT_TD_CALL */
} kt_tool_delta;

typedef bool (*kt_tool_emit)(void *ctx, const kt_tool_delta *d); /* false: out of memory */

typedef struct kt_tool_parser kt_tool_parser;

typedef struct kt_tool_parse_opts {
    bool calls;            /* parse tool calls (tools offered and choice != none) */
    bool reasoning;        /* split thinking out (else it stays in content) */
    bool in_thinking;      /* the prompt opened the thinking block */
    const json_t *tools;   /* for XML arguments' types; may be NULL */
    const char *id_seed;   /* call ids are derived from it and the index */
} kt_tool_parse_opts;

kt_tool_parser *kt_tool_parser_new(const kt_tool_format *f, const kt_tool_parse_opts *o, kt_tool_emit emit,
                                   void *ctx);
/* Feeds generated text; `final` at the end of the reply flushes what was
 * held back. False when emit failed (out of memory). */
bool kt_tool_parser_feed(kt_tool_parser *p, const char *text, size_t n, bool final);
/* The reply was cut short (max_tokens, the context's end): call before the
 * final feed. Text held back because it may begin a marker ("<tool" of
 * "<tool_call>") is then dropped rather than shown as content; a reply
 * that ended normally keeps it (a "<" that ends an answer is the answer's). */
void kt_tool_parser_cut(kt_tool_parser *p);
int kt_tool_parser_calls(const kt_tool_parser *p); /* calls started so far */
void kt_tool_parser_free(kt_tool_parser *p);

/* Call id i of a reply, in the family's form, into out (>= 32 bytes). */
void kt_tool_call_id(const kt_tool_format *f, const char *seed, int i, char *out, size_t cap);

#endif
