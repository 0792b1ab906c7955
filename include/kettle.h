/*
 * kettle.h - the public C API of kettle, a local LLM inference engine.
 *
 * A program links libkettle and uses only this header:
 *
 *     kt_error err;
 *     kt_model *m = kt_model_load("model.gguf", &err);
 *     kt_session *s = kt_session_new(m, &(kt_session_params){0}, &err);
 *     ... kt_tokenize(), kt_session_eval(), kt_sampler_sample() ...
 *
 * Conventions: functions that can fail return a kt_status (or NULL) and fill
 * the caller's kt_error with a message meant for the user. Nothing here
 * calls exit() or prints, except where a function says so.
 */
#ifndef KETTLE_H
#define KETTLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kt_status {
    KT_OK = 0,
    KT_ERR_IO,          /* a file could not be opened, read or written */
    KT_ERR_FORMAT,      /* a file is malformed or hostile */
    KT_ERR_UNSUPPORTED, /* well-formed, but kettle does not handle it yet */
    KT_ERR_ARG,         /* a caller passed an invalid argument */
    KT_ERR_NOMEM,       /* an allocation failed */
    KT_ERR_CONTEXT,     /* the context window is full */
    KT_ERR_INTERNAL,    /* a bug in kettle */
    KT_ERR_BUSY         /* at capacity now (a full queue): try again later */
} kt_status;

typedef struct kt_error {
    kt_status status;
    char msg[512];
} kt_error;

/* ---- models ------------------------------------------------------------ */

typedef struct kt_model kt_model;

typedef struct kt_model_desc {
    const char *arch;     /* "llama", "qwen2", ... */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
    int head_dim;
    float rope_freq_base, rms_eps;
    uint64_t weight_bytes; /* bytes of all tensors in the file */
    uint64_t active_bytes; /* of them, what one token's forward reads: all but the unused experts and an untied embedding table's other rows */
    uint64_t n_params;     /* values in all tensors */
    int bos_id, eos_id;    /* -1 if none */
    int pooling_type;      /* the file's pooling for embeddings (GGUF: 0 none (a generator), 1 mean,
                              2 cls, 3 last, 4 rank); 0 when it declares none */
    int n_repacked;        /* matrices rewritten at load (KT_LOAD_REPACK) */
    int n_deepstack;       /* Qwen3-VL (qwen3vl, qwen3vlmoe): DeepStack layers, whose image rows carry
                              n_embd * (1 + n_deepstack) floats; 0 otherwise */
} kt_model_desc;

/* Memory-maps the file (zero-copy; pages load on first use). */
kt_model *kt_model_load(const char *path, kt_error *err);

typedef enum kt_load_mode {
    KT_LOAD_MMAP = 0,     /* map; pages fault in during the first forward pass */
    KT_LOAD_MMAP_POPULATE, /* map every page at load: slower load, faster first token */
    KT_LOAD_COPY,         /* read into huge-page memory: a copy and the file's size
                             in RAM, up to 2x faster decode of large F16 models */
    KT_LOAD_REPACK        /* copy, then rewrite Q4_0, Q4_K and Q6_K matrices in place
                             in the interleaved layout the kernels read fastest
                             (same RAM as copy; same results, bit for bit).
                             copy and repack map a file that does not fit in
                             90% of the available memory instead (n_repacked
                             then 0) */
} kt_load_mode;

kt_model *kt_model_load_ex(const char *path, kt_load_mode mode, kt_error *err);
/* How far a load has got: `done` of `total` units of `stage`: "reading"
 * (bytes copied from the file: copy, repack) then "repacking" (matrices
 * rewritten: repack). Called on the loading thread, a few hundred times at
 * most, ending with done == total; a mapped file (mmap, populate) reports
 * nothing, its pages come in later or in one system call. */
typedef void (*kt_progress_fn)(void *user, const char *stage, uint64_t done, uint64_t total);
/* kt_model_load_ex that tells `progress` (may be NULL) how far it is. */
kt_model *kt_model_load_progress(const char *path, kt_load_mode mode, kt_progress_fn progress, void *user,
                                 kt_error *err);
void kt_model_free(kt_model *model);
const kt_model_desc *kt_model_describe(const kt_model *model);

/* ---- tokens ------------------------------------------------------------ */

/* Tokenizes UTF-8 text; writes at most cap ids and returns the number the
 * text needs (which may exceed cap: call again with a larger buffer), or -1
 * with err set. `add_bos` follows the model's rule when < 0. */
int kt_tokenize(const kt_model *model, const char *text, size_t len,
                int32_t *ids, int cap, int add_bos, kt_error *err);

/* kt_tokenize, and with parse_specials also control tokens written in the
 * text ("<|im_start|>") become their ids. Only for text kettle made itself
 * (a rendered chat template), never for raw user text, which must not be
 * able to inject control tokens. */
int kt_tokenize_ex(const kt_model *model, const char *text, size_t len, int32_t *ids, int cap,
                   int add_bos, bool parse_specials, kt_error *err);

/* The token's text as the vocabulary stores it ("<s>", "<|im_end|>"),
 * NUL-terminated in buf; returns the length it needs (> cap: truncated). */
int kt_token_text(const kt_model *model, int32_t id, char *buf, int cap);

/* True for tokens that end a turn: EOS, the end-of-turn / end-of-message
 * ids GGUF names, and the end-of-turn control tokens of the common
 * families (<|im_end|>, <|eot_id|>, <|end|>, <end_of_turn>, ...). */
bool kt_token_is_eog(const kt_model *model, int32_t id);

/* The id of the control token whose text is exactly text[0..len), or -1
 * (a grammar names such a token as <[id]>: its bytes are not text). */
int32_t kt_token_control_id(const kt_model *model, const char *text, size_t len);

/* Incremental detokenizer: feed ids one at a time, get the text that is
 * complete so far. Never returns part of a UTF-8 sequence. */
typedef struct kt_detok kt_detok;
kt_detok *kt_detok_new(const kt_model *model);
/* The same; `show_control`: control tokens (which decode to nothing) give
 * their vocabulary text, as tool-call parsers need ([TOOL_CALLS]). */
kt_detok *kt_detok_new_ex(const kt_model *model, bool show_control);
/* Returns a NUL-terminated string valid until the next call (may be ""). */
const char *kt_detok_push(kt_detok *d, int32_t id);
/* Whatever is left (an incomplete sequence becomes U+FFFD). */
const char *kt_detok_flush(kt_detok *d);
void kt_detok_free(kt_detok *d);

/* ---- chat templates ------------------------------------------------- */

/* The model's own chat template (GGUF tokenizer.chat_template), or NULL. */
const char *kt_model_chat_template(const kt_model *model);
/* A template kettle ships ("chatml", "llama2", "llama3", "mistral", "phi3",
 * "gemma"), or NULL. */
const char *kt_chat_builtin_template(const char *name);

/* Renders an OpenAI-style message list (JSON text: an array of {role,
 * content, tool_calls?}; tool-call arguments may be JSON strings) and
 * optional tool definitions (JSON array text, or NULL) with a Jinja chat
 * template (NULL: the model's own). bos_token, eos_token and date_string
 * are set as Hugging Face does. Returns malloc'ed text (free() it), or
 * NULL with err set (a template's raise_exception() message verbatim). */
char *kt_chat_apply(const kt_model *model, const char *template_text, const char *messages_json,
                    const char *tools_json, bool add_generation_prompt, kt_error *err);
/* The variables every template of the model sees (bos_token, eos_token,
 * date_string) as a malloc'ed JSON object text; NULL when out of memory. */
char *kt_chat_context_json(const kt_model *model);
/* The same as kt_chat_apply, with `vars_json` (NULL or a JSON object: more template
 * variables, e.g. {"enable_thinking": false}) and, unless
 * `parse_tool_arguments`, tool-call arguments left as the messages have
 * them (some templates concatenate the JSON string). */
char *kt_chat_apply_ex(const kt_model *model, const char *template_text, const char *messages_json,
                       const char *tools_json, bool add_generation_prompt, const char *vars_json,
                       bool parse_tool_arguments, kt_error *err);

/* ---- sessions: one sequence, its KV cache and scratch ------------------ */

typedef struct kt_session kt_session;

/* KV cache element type: F16, F32, or Q8_0 (half F16's memory; needs
 * head_dim % 32 == 0). The default is F32 for a session (the exact
 * cache) and F16 for the server (half the memory, what llama.cpp keeps). */
typedef enum kt_kv_type { KT_KV_DEFAULT = 0, KT_KV_F16, KT_KV_F32, KT_KV_Q8_0 } kt_kv_type;

/* Whether the model has a multi-token-prediction block (Qwen 3.5's MTP):
 * what kt_session_params.mtp and kt_spec_params.mtp need. */
bool kt_model_has_mtp(const kt_model *m);

typedef struct kt_session_params {
    int n_ctx;          /* context length in tokens; 0 = min(model, 4096) */
    int n_threads;      /* 0 = number of CPUs */
    kt_kv_type kv_type; /* KT_KV_DEFAULT: F32 */
    /* Run the model's multi-token-prediction block (Qwen 3.5's MTP) beside
     * every pass, keeping its KV, so a kt_spec with mtp can draft from it
     * (costs one more decoder block a token). KT_ERR_UNSUPPORTED where the
     * model has none. */
    bool mtp;
} kt_session_params;

kt_session *kt_session_new(kt_model *model, const kt_session_params *params,
                           kt_error *err);
void kt_session_free(kt_session *s);
/* Positions filled so far. */
int kt_session_n_past(const kt_session *s);
/* Positions the session holds at most (its context length). */
int kt_session_n_ctx(const kt_session *s);
/* Drops every position >= n_keep (e.g. 0 to start over). A model with
 * sliding-window layers keeps only their window's positions, so a length
 * whose window they no longer hold drops everything (kt_session_n_past
 * says what was kept); 64 positions before the last evaluated chunk, or
 * later, always work. */
void kt_session_truncate(kt_session *s, int n_keep);

/* Appends n tokens at the end of the sequence. If `logits` is not NULL it
 * receives n_vocab floats per token when all_logits, else the last token's
 * n_vocab. Fails with KT_ERR_CONTEXT (and changes nothing) when the tokens
 * do not fit in the context. */
kt_status kt_session_eval(kt_session *s, const int32_t *tokens, int n,
                          float *logits, bool all_logits, kt_error *err);

/* Appends an image: its grid_x * grid_y embedding rows of the model's
 * n_embd floats (a vision tower's output, one row per merged patch group,
 * row-major; Qwen3-VL models with DeepStack layers, qwen3vl and
 * qwen3vlmoe: n_embd * (1 + n_deepstack) floats, the tower's DeepStack
 * outputs after the main one, as kt_vision_encode writes them; kt_model_desc's
 * n_deepstack), on the M-RoPE grid positions of Qwen-VL text models; the
 * tokens after it take the positions that layout gives them. `logits`
 * as for kt_session_eval's last token. KT_ERR_UNSUPPORTED for a model
 * without M-RoPE sections; KT_ERR_CONTEXT when it does not fit.
 * kt_session_save keeps an image's rows and its grid; the caller's token
 * ids for its positions are whatever stand-ins it chose. */
kt_status kt_session_eval_image(kt_session *s, const float *embd, int grid_x, int grid_y, float *logits,
                                kt_error *err);

/* Writes the KV of the first n positions (n <= kt_session_n_past), the
 * token ids that filled them and a caller's note (e.g. the conversation
 * as JSON; may be NULL) to path: marked with the model's fingerprint,
 * checksummed, and written atomically (a temporary, then a rename), so a
 * crash leaves the old file or the new one. n may not fall inside an
 * image (KT_ERR_ARG). */
kt_status kt_session_save(const kt_session *s, const char *path, const int32_t *tokens, int n,
                          const char *note, kt_error *err);
/* Restores a file of kt_session_save into s: *tokens (malloc'ed, *n of
 * them) and *note (malloc'ed, NULL if none) are what was saved, and s
 * holds their KV, so the next eval continues after them. KT_ERR_IO when
 * the file cannot be read, KT_ERR_FORMAT when it is truncated or corrupt,
 * KT_ERR_ARG when it belongs to another model or KV type or does not fit
 * s's context; s is then empty (truncated to 0). */
kt_status kt_session_load(kt_session *s, const char *path, int32_t **tokens, int *n, char **note,
                          kt_error *err);

/* ---- sampling ---------------------------------------------------------- */

typedef struct kt_sampler_params {
    float temperature;        /* <= 0: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repeat_penalty;     /* 1: off */
    float frequency_penalty;  /* 0: off */
    float presence_penalty;   /* 0: off */
    int penalty_last_n;       /* window for the penalties; 0: off */
    uint64_t seed;
} kt_sampler_params;

/* Defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties
 * off, penalty_last_n 64, seed 0. */
kt_sampler_params kt_sampler_defaults(void);

typedef struct kt_sampler kt_sampler;
kt_sampler *kt_sampler_new(const kt_sampler_params *params, int n_vocab,
                           kt_error *err);
void kt_sampler_free(kt_sampler *s);
/* Picks a token from n_vocab logits (which it may modify). */
int32_t kt_sampler_sample(kt_sampler *s, float *logits);
/* Tells the sampler a token is part of the sequence (for penalties). */
void kt_sampler_accept(kt_sampler *s, int32_t id);

/* ---- speculative decoding for a session (prompt lookup) ----
 *
 * Each step evaluates the pending token together with up to k tokens the
 * context predicts after it (the tokens that followed the latest earlier
 * occurrence of its last few tokens), in one forward pass, and keeps the
 * proposals the sampler draws anyway: every emitted token is the sampler's
 * draw from the same logits with the same random state as plain decoding,
 * so the output is plain decoding's, token for token, at any temperature;
 * only fewer passes produce it. Rejected positions are dropped from the
 * session (kt_session_truncate). */
/* Where proposals come from. */
typedef enum kt_spec_kind {
    KT_SPEC_OFF = 0,
    KT_SPEC_NGRAM, /* prompt lookup: the sequence's own context, then earlier requests' (kettle serve) */
    KT_SPEC_DRAFT, /* a draft model's greedy guesses (kettle serve --draft) */
    KT_SPEC_MTP,   /* the model's own multi-token-prediction block (Qwen 3.5) */
} kt_spec_kind;

/* A proposer of one's own (benchmarks forcing an acceptance rate, tests):
 * given the sequence so far, tokens[0..n) (its last token the pending
 * one), writes up to k guesses of the tokens after it to out and returns
 * how many (0..k). */
typedef int (*kt_spec_propose_fn)(void *ctx, const int32_t *tokens, int n, int k, int32_t *out);

typedef struct kt_spec_params {
    int k_max;          /* most tokens proposed per step (<= 0: 8; at most 32) */
    int min_match;      /* shortest context suffix looked up (<= 0: 2) */
    int max_match;      /* longest (<= 0: 4) */
    bool fixed_k;       /* propose all the lookup finds, up to k_max; else k follows the measured
                           acceptance and cost of verifying, down to 0 (plain decoding) */
    kt_spec_propose_fn propose; /* NULL: prompt lookup (or the draft) */
    void *propose_ctx;
    /* A draft model (the same vocabulary, checked by kt_spec_new; it must
     * outlive the kt_spec): its greedy guesses instead of prompt lookup,
     * from a session of its own kept in step with the target's. */
    kt_model *draft;
    int draft_threads;  /* the draft session's threads (0: as kt_session_params) */
    /* The target's own MTP block's greedy guesses, chained on its own
     * hidden state (the session must be made with kt_session_params.mtp). */
    bool mtp;
} kt_spec_params;

typedef struct kt_spec_stats {
    uint64_t steps;     /* forward passes */
    uint64_t proposed;  /* tokens verified beyond the pending one */
    uint64_t accepted;  /* of them, kept */
    /* with mtp: how many of those prompt lookup proposed, and kept (the rest are the MTP block's) */
    uint64_t lookup_proposed, lookup_accepted;
} kt_spec_stats;

typedef struct kt_spec kt_spec;
kt_spec *kt_spec_new(const kt_model *m, const kt_spec_params *p, kt_error *err);
void kt_spec_free(kt_spec *sp);
/* ctx[0..n) is the sequence: the n - 1 tokens the session holds, then the
 * pending token (sampled and kt_sampler_accept'ed, not yet evaluated).
 * Evaluates it with the step's proposals and writes to out the accepted
 * proposals followed by the next pending token, each drawn by smp (and
 * accepted into it); returns how many (>= 1), or -1 with err (the session
 * is as it was; KT_ERR_CONTEXT when the pending token does not fit). The
 * session then holds ctx and every out token but the last. out has room
 * for k_max + 1. */
int kt_spec_step(kt_spec *sp, kt_session *s, kt_sampler *smp, const int32_t *ctx, int n, int32_t *out,
                 kt_error *err);
kt_spec_stats kt_spec_get_stats(const kt_spec *sp);

#ifdef __cplusplus
}
#endif
#endif
