/*
 * openai.h - the OpenAI API's JSON, without any HTTP: request bodies parsed
 * and validated into generation parameters, prompts rendered and
 * tokenized, and the response / stream-chunk / error objects built in
 * OpenAI's exact shapes.
 *
 * Kept apart from the HTTP layer (http.c) so that every rule about what a
 * request may contain, and every byte of what is answered, can be unit
 * tested without a socket. Nothing here touches the engine thread: the
 * only engine types used are the plain structs of engine.h.
 */
#ifndef KT_SERVER_OPENAI_H
#define KT_SERVER_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "image/image.h"
#include "kettle.h"
#include "toolcall/toolcall.h"

/* An error answered to the client: HTTP status and OpenAI's error object. */
typedef struct srv_error {
    int status;        /* 400, 401, 404, 405, 413, 500, 503 */
    const char *type;  /* "invalid_request_error", "authentication_error", "server_error" */
    const char *code;  /* NULL or e.g. "model_not_found", "context_length_exceeded" */
    char param[64];    /* the offending field, or "" */
    char msg[640];
} srv_error;

/* What kettle took from a request but left out of the prompt or enforced
 * only in part (a hosted tool under tool_choice auto, a schema bound past
 * the grammar's limit), said back to the client in the response header
 * x-kettle-warning, items joined by "; ". Only for what cannot change an
 * answer the client relies on: anything else is a 400 naming it. */
typedef struct srv_notes {
    char text[1024]; /* printable ASCII only: it goes into an HTTP header */
    size_t len;
    bool cut; /* an item did not fit: the text ends with "..." and takes no more */
} srv_notes;

/* Adds one item (n may be NULL: nothing to tell). Bytes outside printable
 * ASCII become '?'; an item that does not fit ends the text with "...". */
void srv_note(srv_notes *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Limits on what one request may hold, each refused with a 400 naming it
 * and its value (the body's size, srv_config.max_body, is a 413). Where
 * OpenAI documents a limit kettle takes it (128 tools); the rest are
 * kettle's own, far above what real clients send: a hostile body must
 * not cost more than a fixed multiple of a normal one. 'stop' (KT_MAX_STOP),
 * 'n' (KT_MAX_CHOICES) and 'top_logprobs' (KT_MAX_TOP_LOGPROBS) are the
 * engine's, in engine.h. */
#define SRV_MAX_JSON_DEPTH 128   /* { and [ nested in the body; real tool schemas nest about 20 */
#define SRV_MAX_MESSAGES   4096  /* 'messages' entries */
#define SRV_MAX_TOOLS      128   /* 'tools' entries (OpenAI's limit) */
#define SRV_MAX_LOGIT_BIAS 1024  /* 'logit_bias' entries */

/* How deeply JSON text nests ({ and [ outside strings), by one scan of
 * its bytes: checked before parsing, since jansson accepts up to 2048
 * levels and the walkers after it (schemas, templates) recurse. Not a
 * validator: malformed text is left to the parser. */
int srv_json_depth(const char *s, size_t n);

/* What stands between the text parts of one message when they are joined
 * into the one string chat templates take (OpenAI's text parts, Anthropic's
 * text blocks, the Responses API's input_text parts): a paragraph break,
 * so two parts never run together into one word ("Hello" + "World"). */
#define SRV_TEXT_PART_SEP "\n\n"
/* Where an image part was, in the joined text the template renders (as
 * llama.cpp's libmtmd marks media); the prompt's image tokens go there. */
#define SRV_IMAGE_MARKER "<__media__>"

/* A growable byte buffer (srv_buf_append). */
typedef struct srv_buf {
    char *data;
    size_t len, cap;
} srv_buf;

/* Fills e (status, type, param, code, message); returns false so that
 * parsers can `return srv_fail(...)`. */
bool srv_fail(srv_error *e, int status, const char *type, const char *param, const char *code,
              const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* {"error":{"message","type","param","code"}} as malloc'ed compact text. */
char *srv_error_json(const srv_error *e);

typedef enum srv_kind { SRV_CHAT = 0, SRV_COMPLETION = 1 } srv_kind;

/* A validated generation request. Strings point into the parsed body,
 * which must outlive it. */
typedef struct srv_gen_req {
    srv_kind kind;
    bool stream, include_usage;
    const char *prompt;        /* completions: the raw prompt */
    json_t *messages, *tools;  /* chat: borrowed from the body */
    int max_tokens;            /* < 0: until the context is full */
    bool prefill_only;         /* max_tokens 0: the prompt into the cache, no output */
    int n_choices;
    kt_sampler_params sampling;
    bool seed_given;           /* the request named its seed (else a fresh one) */
    const char *stop[KT_MAX_STOP];
    int n_stop;
    bool logprobs;
    int top_logprobs;          /* engine value: -1 none, else 0..KT_MAX_TOP_LOGPROBS */
    kt_logit_bias *logit_bias; /* malloc'ed (srv_gen_req_free) */
    int n_logit_bias;
    int priority;
    bool ignore_eos;           /* extension: do not stop at end-of-turn tokens */
    char *grammar;             /* GBNF from response_format or 'grammar'; malloc'ed, NULL: none */
    /* chat: tools and reasoning */
    kt_tool_choice tool_choice; /* KT_TOOL_NONE without tools */
    const char *tool_name;     /* tool_choice {"function": {"name"}} */
    bool parallel_tool_calls;  /* default true */
    bool reasoning_split;      /* thinking goes to reasoning_content (reasoning_format "none": no) */
    json_t *template_kwargs;   /* chat_template_kwargs: extra template variables, borrowed */
    const char *effort;        /* reasoning_effort as the request gave it (NULL: none), borrowed */
    /* worked out with the prompt (srv_prompt_tokens) */
    const kt_tool_format *format; /* the template's family; NULL: completions */
    kt_tool_think think;       /* where the prompt left the thinking block */
    kt_tool_grammar tools_grammar; /* what keeps calls valid (empty without tools) */
    srv_notes *notes;          /* where to say what was left out (the connection's); NULL: nowhere */
    /* images (a model with a vision tower): their URLs in the order the
     * parts came (owned), then, with the prompt, each decoded and
     * preprocessed (images.c; preps owned until submit takes them) */
    json_t *image_urls;
    kt_prompt_image *images;
    int n_images;
} srv_gen_req;

/* What the parser needs to know about the model a request goes to (its
 * name was matched by the server's routing, classes.c). */
typedef struct srv_model_info {
    int n_vocab; /* logit_bias keys are token ids below it */
    bool vision; /* the model takes images (--mmproj) */
} srv_model_info;

/* Validates a chat / completion body. `random_seed` is used when the
 * request names none. Returns false with e filled (400/404). */
bool srv_parse_gen(json_t *body, srv_kind kind, const srv_model_info *mi, uint64_t random_seed,
                   srv_gen_req *out, srv_error *e);
void srv_gen_req_free(srv_gen_req *r);

struct srv_sampled;

/* The prompt as tokens: chat messages rendered with `template_text`
 * (the conversation first made ready for it, kt_tool_prepare; tools
 * also set r's format, in_thinking and tools_grammar)
 * (NULL: the model's own) and tokenized with control tokens matched (BOS
 * added unless the template wrote it), or the raw completion prompt with
 * the model's BOS rule. An assistant message whose content `sampled`
 * remembers, and which the template follows with an end-of-turn token,
 * becomes the ids that were sampled for it rather than its re-tokenized
 * text. Returns the count (>= 1) and a malloc'ed array, or -1 with e
 * filled. */
/* A model's vision tower and the images it may be sent (NULL: no images). */
typedef struct srv_vision_env {
    struct kt_vision *vision;
    kt_image_limits limits;
    int max_tokens; /* a request's images together: the context (0: no bound) */
    bool fetch_urls; /* --allow-image-urls: http(s) image URLs are fetched (bounded) */
    struct srv_image_memo *memo; /* the class's images already decoded (image_memo.h); NULL: none */
} srv_vision_env;

int srv_prompt_tokens(const kt_model *m, const char *template_text, struct srv_sampled *sampled,
                      srv_gen_req *r, const srv_vision_env *vis, int32_t **ids, srv_error *e);

/* images.c: r's image URLs decoded and preprocessed for the tower into
 * r->images (400 naming the image and its fault); and their release. */
bool srv_images_load(srv_gen_req *r, const srv_vision_env *env, srv_error *e);
void srv_images_free(srv_gen_req *r);

/* The engine must show control tokens as text: the family's markers are
 * control tokens and the reply is parsed for calls or reasoning, or is
 * gpt-oss's (harmony: channels, parsed or, with reasoning_format "none",
 * returned raw). */
bool srv_gen_special_text(const srv_gen_req *r);

/* Maps a failed kt_engine_submit_ex to the answer: KT_ERR_ARG 400 naming
 * the request parameter `field` is about, KT_ERR_CONTEXT 400
 * context_length_exceeded, KT_ERR_BUSY 503, anything else 500; the
 * engine's message is kept. */
void srv_submit_error(const kt_error *err, kt_gen_field field, srv_kind kind, srv_error *e);

/* ---- responses ---- */

/* One choice's output, gathered event by event. */
typedef struct srv_choice {
    char *text;
    size_t len, cap;
    kt_finish finish;
    int stop_string;             /* kt_event.stop_string: which stop string ended it (index + 1), 0: none */
    char error[160];
    json_t *lp_content;          /* chat: logprobs.content[] */
    json_t *lp_tokens, *lp_token_logprobs, *lp_top, *lp_offsets; /* completions */
    size_t text_offset;          /* completions: where the next token starts */
    int32_t *ids;                /* the sampled ids, for the sampled-ids memory */
    int n_ids, cap_ids;
    bool ids_cut;                /* a stop string cut the text: ids and text differ */
    /* chat: the text parsed into content, reasoning and tool calls */
    struct srv_reply *reply;     /* its reply (the parser's callback needs it) */
    int index;
    kt_tool_parser *parser;      /* NULL: the text is the content */
    srv_buf content, reasoning;
    json_t *calls;               /* [{id, type, function: {name, arguments}}] */
} srv_choice;

/* The response being built for one request. */
typedef struct srv_reply {
    srv_kind kind;
    const kt_model *model;
    const char *model_name;
    char id[48];
    long long created;
    int n_choices;
    bool logprobs;
    size_t prompt_chars;  /* completions: text_offset of the first token */
    bool streaming;       /* deltas of the parsers become chunks (pending) */
    json_t *pending;      /* chunks made by the last srv_reply_track */
    int pending_choice;
    kt_request *req;        /* the engine request, for what a stream reports before it ends (the prompt tokens
                             * the cache served); NULL: a stored answer (--result-cache) */
    srv_choice choices[KT_MAX_CHOICES];
} srv_reply;

/* Returns false on allocation failure. */
bool srv_reply_init(srv_reply *rp, const srv_gen_req *r, const kt_model *m, const char *model_name,
                    const char *id, long long created);
void srv_reply_free(srv_reply *rp);
/* Adds an event's text, logprobs and finish to its choice; false on
 * allocation failure. */
bool srv_reply_add(srv_reply *rp, const kt_event *ev);
/* The part of srv_reply_add a stream needs too: text, sampled id, finish,
 * and the parse of the text (for a stream, into chunks for
 * srv_chunk_event). */
bool srv_reply_track(srv_reply *rp, const kt_event *ev);
/* Chat: hands every choice whose text is exactly its sampled ids (ended by
 * length or an end-of-turn token, not cut by a stop string) to the
 * sampled-ids memory. */
void srv_reply_remember(const srv_reply *rp, struct srv_sampled *m);
/* The first choice that ended in KT_FINISH_ERROR, or -1. */
int srv_reply_error_choice(const srv_reply *rp);

/* The whole non-streaming answer (chat.completion / text_completion). */
json_t *srv_reply_json(const srv_reply *rp, const kt_request_usage *u);

/* Streaming: the role chunk a chat stream opens each choice with. */
json_t *srv_chunk_role(const srv_reply *rp, int choice, bool include_usage);
/* The chunks for one event (after srv_reply_track): its deltas (content,
 * reasoning_content, tool_calls) and logprobs, as a JSON array in *out,
 * or NULL when it carries none (completions: advances the choice's
 * text_offset). False only when out of memory: the delta could not be
 * made and the stream must end with an error, not skip it. */
bool srv_chunk_event(srv_reply *rp, const kt_event *ev, bool include_usage, json_t **out);
/* The chunk that ends choice i: empty delta and its finish_reason. */
json_t *srv_chunk_finish(const srv_reply *rp, int i, kt_finish f, bool include_usage);
/* The final usage chunk: "choices":[] and "usage". */
json_t *srv_chunk_usage(const srv_reply *rp, const kt_request_usage *u);

/* Appends "data: JSON\n\n" to a growable buffer (steals `j`); false on
 * allocation failure. (srv_buf is defined above, with the errors.) */
bool srv_buf_append(srv_buf *b, const char *s, size_t n);
bool srv_buf_sse(srv_buf *b, json_t *j);
void srv_buf_free(srv_buf *b);

/* A token as OpenAI shows it: its text (SentencePiece's U+2581 as a space,
 * <0xNN> byte tokens as that byte, invalid UTF-8 as U+FFFD) and its raw
 * bytes. Returns a new json_t string; *bytes (may be NULL) gets the array. */
json_t *srv_token_json(const kt_model *m, int32_t token, json_t **bytes);

/* /tokenize and /detokenize bodies -> answers (NULL with e filled). */
json_t *srv_tokenize(const kt_model *m, json_t *body, srv_error *e);
json_t *srv_detokenize(const kt_model *m, json_t *body, srv_error *e);

/* True if s[0..n) is valid UTF-8 (jansson already rejects invalid input
 * text; this guards text kettle builds, such as error messages). */
bool srv_utf8_valid(const char *s, size_t n);

#endif
