/*
 * json_schema.h - JSON Schema to GBNF.
 *
 * `response_format: {"type": "json_schema", ...}`, typed outputs of the
 * agent SDKs and tool-call arguments all come as JSON Schema; kettle turns
 * a schema into GBNF text (compiled by grammar.h's parser) whose sentences
 * are exactly the JSON texts that validate, in kettle's output form:
 * properties in the schema's definition order, optional whitespace kept
 * small. The policy is llguidance's: a schema or keyword kettle cannot
 * enforce is refused with an error that names it and where it is (a JSON
 * pointer), never silently ignored. Annotations that constrain nothing
 * (title, description, examples, default, $comment, ...) are accepted.
 */
#ifndef KT_GRAMMAR_JSON_SCHEMA_H
#define KT_GRAMMAR_JSON_SCHEMA_H

#include <stdbool.h>

#include <jansson.h>

#include "kettle.h"

/* Converts `schema` (a JSON Schema, draft 2020-12 with the common older
 * spellings) to GBNF text with a rule named "root". Returns a malloc'd
 * NUL-terminated string, or NULL with err set: KT_ERR_UNSUPPORTED for a
 * keyword or value kettle cannot enforce ("at /properties/a: keyword
 * 'uniqueItems' is not supported"), KT_ERR_ARG for a schema that is not
 * valid JSON Schema (a bad $ref, a type that is not a type name). */
char *kt_json_schema_to_gbnf(const json_t *schema, kt_error *err);

/* How a schema kettle can enforce only in part is taken. Tool-call
 * arguments are the model's proposal to the client, which checks them
 * anyway: there a count bound past the grammar's repeat limit
 * (KT_GRAMMAR_MAX_REPEAT; Claude Code gives a script parameter maxLength
 * 524288) is enforced as far as a grammar can, a maximum left out and a
 * minimum lowered to the limit, and said in `relaxed`, instead of the
 * whole request refused. response_format takes no options: an answer must
 * match its schema or the request is refused. */
typedef struct kt_schema_opts {
    bool relax_bounds;
    char *relaxed;     /* what was not enforced, "at POINTER: what" items joined by "; " (cut when full); may be NULL */
    size_t relaxed_cap;
} kt_schema_opts;

char *kt_json_schema_to_gbnf_ex(const json_t *schema, const kt_schema_opts *opts, kt_error *err);

/* The grammar of any JSON value (response_format json_object uses the
 * object form: `object_only`). Static text; never fails. */
const char *kt_json_any_gbnf(bool object_only);

/* The GBNF expression (parenthesised, no rules of its own) for the
 * content of a JSON string, between its quotes, whose decoded text
 * matches the ECMAScript regular expression `pattern` under JSON Schema's
 * unanchored semantics. Only a regular subset is supported (listed in
 * json_schema_regex.c); the rest is KT_ERR_UNSUPPORTED naming the
 * construct, a malformed pattern KT_ERR_ARG. The expression refers to a
 * rule named "char" (one encoded JSON string character) that the caller
 * defines. Returns malloc'd text or NULL with err set. */
char *kt_json_regex_gbnf(const char *pattern, kt_error *err);

#endif
