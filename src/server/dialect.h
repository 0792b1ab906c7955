/*
 * dialect.h - the other APIs kettle speaks beside OpenAI's chat
 * completions: OpenAI's Responses API (responses.c) and Anthropic's
 * Messages API (anthropic.c).
 *
 * A dialect is a translation, not a second server: its request body is
 * rewritten into a chat-completions body, which then goes through the one
 * validation, prompt rendering, tool-call grammar and engine path
 * (openai.c, gen.c); the answer is built as a chat completion and rewritten
 * into the dialect's shape. Streams are translated chunk by chunk: the
 * chat chunks' deltas (reasoning, text, tool-call name and arguments)
 * become the dialect's output blocks, each opened, filled and closed with
 * the dialect's events (srv_blocks below does the bookkeeping both share).
 * So every rule of the chat path (unsupported parameters refused, calls
 * valid by construction, the prefix cache, cancellation) holds for every
 * dialect, and a fix in one place fixes all.
 */
#ifndef KT_SERVER_DIALECT_H
#define KT_SERVER_DIALECT_H

#include <jansson.h>
#include <stdbool.h>

#include "server/openai.h"

/* ---- output blocks, from chat deltas ---- */

typedef enum srv_block_kind { SRV_BLOCK_REASONING, SRV_BLOCK_TEXT, SRV_BLOCK_CALL } srv_block_kind;

/* One block of an answer: its thinking, its text, or one tool call. */
typedef struct srv_block {
    srv_block_kind kind;
    int index;        /* 0, 1, ... in the order the blocks opened */
    char call_id[64]; /* calls: the call's id */
    char name[72];    /* calls: the function's name */
    srv_buf text;     /* everything so far: the text, the thinking, or the arguments */
} srv_block;

/* What a dialect does as blocks open, grow and close. */
typedef struct srv_block_ops {
    bool (*open)(void *ctx, const srv_block *b);
    bool (*delta)(void *ctx, const srv_block *b, const char *s, size_t n);
    bool (*close)(void *ctx, const srv_block *b);
} srv_block_ops;

/* The block being filled from a stream of chat chunks (choice 0). */
typedef struct srv_blocks {
    srv_block cur;
    bool open;
    int n_blocks;
    char finish[16]; /* the chat finish_reason once seen ("stop", "length", "tool_calls"), else "" */
} srv_blocks;

/* Feeds one chat.completion.chunk: deltas go to the open block (a
 * different kind, or a new call, closes it and opens the next); a
 * finish_reason closes the last. False when an op failed (out of memory). */
bool srv_blocks_feed(srv_blocks *bs, json_t *chunk, const srv_block_ops *ops, void *ctx);
/* Closes the open block, if any (a stream that ended without a finish). */
bool srv_blocks_close(srv_blocks *bs, const srv_block_ops *ops, void *ctx);
void srv_blocks_free(srv_blocks *bs);

/* ---- a dialect ---- */

/* A stream's translation state (each dialect's own). */
typedef struct srv_xlate srv_xlate;

typedef struct srv_dialect {
    const char *path; /* "/v1/responses", "/v1/messages" */
    /* The dialect's request body as a chat-completions body (a new
     * object; body is not changed), or NULL with e filled. What it
     * accepts but leaves out goes to notes (may be NULL). */
    json_t *(*to_chat)(json_t *body, srv_notes *notes, srv_error *e);
    /* The whole answer: the chat completion `done` (as srv_reply_json
     * makes it) in the dialect's shape. rp gives what the chat JSON does
     * not say (which stop string ended it). NULL: out of memory. */
    json_t *(*from_chat)(json_t *body, json_t *done, const srv_reply *rp, const srv_gen_req *r);
    /* The error object in the dialect's shape, malloc'ed text. */
    char *(*error_json)(const srv_error *e);
    /* Streams: state made once the request is accepted (n_prompt: its
     * prompt tokens), fed every chat chunk in order, ended with the
     * usage, or with an error; each appends the dialect's SSE events. */
    srv_xlate *(*stream_new)(json_t *body, const srv_reply *rp, const srv_gen_req *r, int n_prompt);
    bool (*stream_chunk)(srv_xlate *x, json_t *chunk, srv_buf *out);
    bool (*stream_end)(srv_xlate *x, const kt_request_usage *u, srv_buf *out);
    bool (*stream_error)(srv_xlate *x, const char *msg, srv_buf *out);
    void (*stream_free)(srv_xlate *x);
    /* What a stream that ran out of memory ends with (static text). */
    const char *stream_oom_end;
    /* What a stream quiet for --sse-keepalive-ms sends (static text): an
     * event the API's clients know to skip, or an SSE comment, which every
     * SSE parser skips. An event goes only after the stream's opening
     * events: before stream_begun says they are out, the stream sends the
     * SSE comment instead (gen.c). */
    const char *stream_keepalive;
    /* Whether the stream's opening events have been written (so an event
     * may follow them); NULL: from stream_new on. */
    bool (*stream_begun)(const srv_xlate *x);
} srv_dialect;

extern const srv_dialect SRV_DIALECT_RESPONSES; /* OpenAI's Responses API (responses.c) */
extern const srv_dialect SRV_DIALECT_MESSAGES;  /* Anthropic's Messages API (anthropic.c) */

/* POST /v1/messages/count_tokens's body as a chat body (anthropic.c): the
 * Messages body without max_tokens. */
json_t *srv_messages_count_body(json_t *body, srv_notes *notes, srv_error *e);

/* ---- helpers the dialects share (dialect.c) ---- */

/* Appends "event: NAME\ndata: JSON\n\n" (steals j); false on failure. */
bool srv_buf_event(srv_buf *b, const char *name, json_t *j);
/* Copies body[key] into chat[key] when present and not null. */
bool srv_copy_field(json_t *chat, json_t *body, const char *key);
/* The text of parts [{type, text}] whose type is one of `types`
 * (NULL-terminated), joined; a string stays itself. NULL with e filled
 * (naming `where`) for another part type or shape. */
json_t *srv_parts_text(json_t *content, const char *const *types, const char *where, srv_error *e);
/* As srv_parts_text, but image parts (srv_image_part) are taken too: then
 * the content stays an array of OpenAI chat parts (text and image_url),
 * which the chat parser turns into the prompt's images. */
json_t *srv_parts_chat(json_t *content, const char *const *types, const char *where, srv_error *e);
json_t *srv_image_part(json_t *p, const char *where, size_t i, bool *bad, srv_error *e);
/* A call's arguments text parsed as JSON (the object a tool_use block
 * carries). NULL if it is not a JSON object (a call cut short), or when
 * out of memory (*oom). */
json_t *srv_args_object(const char *s, size_t n, bool *oom);

#endif
