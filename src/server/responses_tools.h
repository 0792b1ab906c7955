/*
 * responses_tools.h - the tools of a Responses request (responses.c) as
 * chat tools, and the way back from a chat call to the Responses item the
 * client expects.
 *
 * What the model can call becomes a chat function: a function tool as it
 * is; a custom tool as a function of one string argument, `input`; the
 * function and custom tools of a namespace under qualified names
 * (namespace__name: chat names allow no '.' past some templates' call
 * syntax, and Codex itself named MCP tools mcp__SERVER__TOOL before it
 * had namespaces). Hosted tools (web search, file search, computer use,
 * code interpreter, image generation, remote MCP, tool search, and the
 * local shell / shell / apply_patch tools whose calls are items kettle
 * does not make) are left out of the prompt with a note under
 * tool_choice auto, and refused when tool_choice forces one.
 *
 * The way back needs no parsing of names: the same walk over the
 * request's tools maps each chat name to its tool's type, name and
 * namespace (rsp_callables), so a call is answered as a function_call
 * with `namespace`, or a custom_tool_call with its `input`, as Codex
 * routes them (by namespace and name, never by splitting a name).
 */
#ifndef KT_SERVER_RESPONSES_TOOLS_H
#define KT_SERVER_RESPONSES_TOOLS_H

#include <jansson.h>
#include <stdbool.h>

#include "server/openai.h"

#define RSP_NAME_MAX 64 /* chat's limit on a function name (openai.c) */

/* The name the model knows a tool by: `name` alone at the top level or
 * in "functions" (Codex's default namespace, which it treats as none),
 * else namespace__name; a name past 64 characters keeps its first 55 and
 * ends with '_' and 8 hex digits of a hash of the whole, so it stays
 * unique and the same in every request. */
void rsp_chat_name(const char *ns, const char *name, char out[RSP_NAME_MAX + 1]);

/* The request's tools (`tools` and any additional_tools input items) and
 * `tool_choice` as chat's `tools` and `tool_choice`, set in chat. False
 * with e filled: a 400 naming the field, or a 500 when out of memory. */
bool rsp_tools_to_chat(json_t *body, json_t *chat, srv_notes *notes, srv_error *e);

/* What each chat name stands for, for the answer: an object mapping it
 * to {"type": "function" | "custom", "name", "namespace"?}. The body is
 * one to_chat accepted. NULL when out of memory. */
json_t *rsp_callables(json_t *body);

#endif
