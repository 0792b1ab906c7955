/*
 * api.c - the public API of kettle.h over the model, text and ops layers.
 *
 * A kt_model owns the GGUF file (mapped or copied, see kt_load_mode), the
 * bound weights, the chat template, the end-of-turn tokens and the
 * vocabulary. A kt_session owns one sequence: its KV cache, scratch and
 * thread pool. Sessions of one model are independent (each may be used
 * from its own thread); the model is read-only after load.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "base/error.h"
#include "base/huge.h"
#include "base/json_safe.h"
#include "gguf/gguf.h"
#include "kettle.h"
#include "model/deepstack.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/mtp.h"
#include "ops/pool.h"
#include "text/chat.h"
#include "text/chat_builtin.h"
#include "text/detok.h"
#include "text/vocab.h"
#include "engine/model_internal.h"

/* A session is one sequence on a private KV pool of one F32 block of
 * n_ctx positions: a contiguous cache, read by the same forward pass and
 * attention kernel as the server's paged F16 one. */
struct kt_detok {
    kt_text_detok *impl;
};

static void describe(kt_model *m) {
    const llm_config *c = &m->llm->cfg;
    m->desc = (kt_model_desc){
        .arch = c->arch, .n_vocab = c->n_vocab, .n_embd = c->n_embd, .n_layer = c->n_layer,
        .n_head = c->n_head, .n_head_kv = c->n_head_kv, .n_ff = c->n_ff,
        .n_ctx_train = c->n_ctx_train, .head_dim = c->head_dim,
        .rope_freq_base = c->rope_freq_base, .rms_eps = c->rms_eps,
        .weight_bytes = m->llm->weight_bytes, .active_bytes = m->llm->active_bytes, .n_params = m->llm->n_params,
        .bos_id = kt_vocab_bos(m->vocab), .eos_id = kt_vocab_eos(m->vocab),
        .n_repacked = m->n_repacked, .pooling_type = c->pooling_type, .n_deepstack = c->n_deepstack,
    };
}

/* End-of-turn control tokens of the common families, by text. */
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<|END_OF_TURN_TOKEN|>", "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", /* DeepSeek */
};

static void add_eog(kt_model *m, int64_t id) {
    if (id < 0 || id >= kt_vocab_size(m->vocab) || m->n_eog == KT_MAX_EOG) return;
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog[i] == id) return;
    m->eog[m->n_eog++] = (int32_t)id;
}

static void find_eog_tokens(kt_model *m) {
    int64_t id;
    add_eog(m, kt_vocab_eos(m->vocab));
    if (gguf_get_i64(m->file, "tokenizer.ggml.eot_token_id", -1, &id)) add_eog(m, id);
    if (gguf_get_i64(m->file, "tokenizer.ggml.eom_token_id", -1, &id)) add_eog(m, id);
    for (size_t i = 0; i < sizeof EOG_TEXTS / sizeof EOG_TEXTS[0]; i++) {
        int32_t t = kt_vocab_find(m->vocab, EOG_TEXTS[i], strlen(EOG_TEXTS[i]));
        if (t >= 0 && kt_vocab_type(m->vocab, t) != KT_TOKEN_NORMAL) add_eog(m, t);
    }
}

/* Copies tokenizer.chat_template, if any; false only when out of memory. */
static bool read_chat_template(kt_model *m) {
    int64_t k = gguf_find_key(m->file, "tokenizer.chat_template");
    gguf_str s;
    if (k < 0 || !gguf_kv_get_str(m->file, k, &s)) return true;
    m->chat_template = strndup(s.ptr, s.len);
    return m->chat_template != NULL;
}

/* KT_LOAD_REPACK: the weights are our copy of the file; rewritten while
 * writable, then read-only again like any other load. */
static bool repack(kt_model *m, const char *path, kt_progress_fn progress, void *user, kt_error *err) {
    /* a file too large to copy was mapped (gguf.h): it runs as it is */
    if (!gguf_set_writable(m->file, true)) return true;
    m->n_repacked = llm_model_repack(m->llm, progress, user, err);
    gguf_set_writable(m->file, false);
    if (m->n_repacked < 0) kt_error_wrap(err, "%s", path);
    return m->n_repacked >= 0;
}

kt_model *kt_model_load(const char *path, kt_error *err) {
    return kt_model_load_ex(path, KT_LOAD_MMAP, err);
}

kt_model *kt_model_load_ex(const char *path, kt_load_mode mode, kt_error *err) {
    return kt_model_load_progress(path, mode, NULL, NULL, err);
}

kt_model *kt_model_load_progress(const char *path, kt_load_mode mode, kt_progress_fn progress, void *user,
                                 kt_error *err) {
    static const gguf_load_mode MODES[] = {GGUF_LOAD_MAP, GGUF_LOAD_POPULATE, GGUF_LOAD_COPY, GGUF_LOAD_COPY};
    if ((unsigned)mode > KT_LOAD_REPACK) {
        kt_error_set(err, KT_ERR_ARG, "unknown load mode %d", (int)mode);
        return NULL;
    }
    kt_model *m = calloc(1, sizeof *m);
    if (!m) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (!(m->file = gguf_open_progress(path, MODES[mode], progress, user, err))) goto fail;
    if (!(m->llm = llm_model_load(m->file, err)) || !(m->vocab = kt_vocab_from_gguf(m->file, err))) {
        kt_error_wrap(err, "%s", path);
        goto fail;
    }
    if (mode == KT_LOAD_REPACK && !repack(m, path, progress, user, err)) goto fail;
    if (kt_vocab_size(m->vocab) != m->llm->cfg.n_vocab) {
        kt_error_set(err, KT_ERR_FORMAT, "%s: the tokenizer has %d tokens but the weights have %d rows",
                     path, kt_vocab_size(m->vocab), m->llm->cfg.n_vocab);
        goto fail;
    }
    if (!read_chat_template(m)) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    find_eog_tokens(m);
    describe(m);
    return m;
fail:
    kt_model_free(m);
    return NULL;
}

void kt_model_free(kt_model *m) {
    if (!m) return;
    free(m->chat_template);
    kt_vocab_free(m->vocab);
    llm_model_free(m->llm);
    gguf_close(m->file);
    free(m);
}

const kt_model_desc *kt_model_describe(const kt_model *m) {
    return &m->desc;
}

int kt_tokenize(const kt_model *m, const char *text, size_t len, int32_t *ids, int cap, int add_bos,
                kt_error *err) {
    return kt_tokenize_ex(m, text, len, ids, cap, add_bos, false, err);
}

int kt_tokenize_ex(const kt_model *m, const char *text, size_t len, int32_t *ids, int cap, int add_bos,
                   bool parse_specials, kt_error *err) {
    bool bos = add_bos < 0 ? kt_vocab_add_bos(m->vocab) : add_bos != 0;
    return kt_vocab_encode_ex(m->vocab, text, len, bos, parse_specials, ids, cap, err);
}

int kt_token_text(const kt_model *m, int32_t id, char *buf, int cap) {
    size_t len = 0;
    const char *p = id >= 0 && id < kt_vocab_size(m->vocab) ? kt_vocab_piece(m->vocab, id, &len) : "";
    if (cap > 0) {
        size_t n = len < (size_t)cap - 1 ? len : (size_t)cap - 1;
        memcpy(buf, p, n);
        buf[n] = 0;
    }
    return (int)len;
}

bool kt_token_is_eog(const kt_model *m, int32_t id) {
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog[i] == id) return true;
    return false;
}

/* ---- chat templates ---- */

const char *kt_model_chat_template(const kt_model *m) {
    return m->chat_template;
}

const char *kt_chat_builtin_template(const char *name) {
    return kt_chat_builtin(name);
}

static json_t *parse_json_arg(const char *text, const char *what, kt_error *err) {
    json_error_t jerr;
    json_t *j = kt_json_loads(text, 0, &jerr);
    if (!j && json_error_code(&jerr) == json_error_out_of_memory) {
        kt_error_set(err, KT_ERR_NOMEM, "%s: out of memory reading the JSON", what);
        return NULL;
    }
    if (!j || !json_is_array(j)) {
        json_decref(j);
        kt_error_set(err, KT_ERR_ARG, "%s: expected a JSON array (%s)", what, j ? "got another type" : jerr.text);
        return NULL;
    }
    return j;
}


static json_t *chat_context(const kt_model *m) {
    char bos[256], eos[256], date[32];
    kt_token_text(m, kt_vocab_bos(m->vocab), bos, sizeof bos);
    kt_token_text(m, kt_vocab_eos(m->vocab), eos, sizeof eos);
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%d %b %Y", localtime_r(&now, &tm));
    return json_pack("{s:s, s:s, s:s}", "bos_token", bos, "eos_token", eos, "date_string", date);
}

char *kt_chat_context_json(const kt_model *m) {
    json_t *ctx = chat_context(m);
    char *s = ctx ? kt_json_dumps(ctx, JSON_COMPACT) : NULL;
    json_decref(ctx);
    return s;
}

char *kt_chat_apply_ex(const kt_model *m, const char *template_text, const char *messages_json,
                       const char *tools_json, bool add_generation_prompt, const char *vars_json,
                       bool parse_tool_arguments, kt_error *err) {
    const char *tmpl = template_text ? template_text : m->chat_template;
    if (!tmpl) {
        kt_error_set(err, KT_ERR_ARG, "the model has no chat template; give one (built-ins: %s)",
                     kt_chat_builtin_names());
        return NULL;
    }
    json_t *messages = parse_json_arg(messages_json, "messages", err), *tools = NULL, *ctx = NULL, *vars = NULL;
    char *out = NULL;
    if (vars_json && !json_is_object(vars = kt_json_loads(vars_json, 0, NULL))) {
        kt_error_set(err, KT_ERR_ARG, "chat template variables must be a JSON object");
    } else if (messages && (!tools_json || (tools = parse_json_arg(tools_json, "tools", err)))) {
        if ((parse_tool_arguments && !kt_chat_parse_tool_arguments(messages)) || !(ctx = chat_context(m)) ||
            (vars && json_object_update(ctx, vars)))
            kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        else out = kt_chat_render(tmpl, messages, tools, add_generation_prompt, ctx, err);
    }
    json_decref(ctx), json_decref(tools), json_decref(messages), json_decref(vars);
    return out;
}

char *kt_chat_apply(const kt_model *m, const char *template_text, const char *messages_json,
                    const char *tools_json, bool add_generation_prompt, kt_error *err) {
    return kt_chat_apply_ex(m, template_text, messages_json, tools_json, add_generation_prompt, NULL, true, err);
}

kt_detok *kt_detok_new_ex(const kt_model *m, bool show_control) {
    kt_detok *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    /* Generated text continues the prompt, so its leading space is real. */
    if (!(d->impl = kt_text_detok_new(m->vocab, false))) {
        free(d);
        return NULL;
    }
    kt_text_detok_show_control(d->impl, show_control);
    return d;
}

kt_detok *kt_detok_new(const kt_model *m) {
    return kt_detok_new_ex(m, false);
}

int32_t kt_token_control_id(const kt_model *m, const char *text, size_t len) {
    int32_t id = kt_vocab_find(m->vocab, text, len);
    if (id < 0) return -1;
    kt_token_type t = kt_vocab_type(m->vocab, id);
    return t == KT_TOKEN_CONTROL ? id : -1;
}

const char *kt_detok_push(kt_detok *d, int32_t id) {
    return kt_text_detok_push(d->impl, id);
}

const char *kt_detok_flush(kt_detok *d) {
    return kt_text_detok_flush(d->impl);
}

void kt_detok_free(kt_detok *d) {
    if (!d) return;
    kt_text_detok_free(d->impl);
    free(d);
}

bool kt_model_has_mtp(const kt_model *m) {
    return m->llm->cfg.n_mtp > 0;
}

/* A session's pool: one block of the whole context (every position of a
 * layer in a row), unless the model has sliding-window layers and the
 * context is more than twice their span: then blocks of
 * SESSION_BLOCK_TOKENS, and window slots for one sequence's span (its
 * next token's window, the slack block, a chunk of LLM_MAX_BATCH and the
 * partial blocks), which saves most of those layers' memory. */
#define SESSION_BLOCK_TOKENS 64
static kv_pool_params session_kv_params(const llm_model *m, int n_ctx, kv_type type) {
    const int bt = SESSION_BLOCK_TOKENS, n_blocks = (n_ctx + bt - 1) / bt;
    kv_pool_params paged = llm_kv_params(m, n_blocks, bt, type);
    paged.n_window_blocks = kv_window_span(&paged, LLM_MAX_BATCH);
    if (paged.n_window_blocks == 0 || 2 * paged.n_window_blocks >= n_blocks) return llm_kv_params(m, 1, n_ctx, type);
    return paged;
}

kt_session *kt_session_new(kt_model *m, const kt_session_params *p, kt_error *err) {
    int n_ctx = p && p->n_ctx > 0 ? p->n_ctx : m->llm->cfg.n_ctx_train;
    if (!(p && p->n_ctx > 0) && n_ctx > 4096) n_ctx = 4096;
    if (n_ctx < 1 || n_ctx > (1 << 24)) {
        kt_error_set(err, KT_ERR_ARG, "context length %d is out of range", n_ctx);
        return NULL;
    }
    kv_type type;
    if (llm_kv_type(m->llm, p ? p->kv_type : KT_KV_DEFAULT, KV_F32, &type, err) != KT_OK) return NULL;
    kt_session *s = calloc(1, sizeof *s);
    if (!s) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->model = m;
    s->n_ctx = n_ctx;
    kv_pool_params kp = session_kv_params(m->llm, n_ctx, type);
    if (p && p->mtp) {
        if (!m->llm->cfg.n_mtp) {
            kt_error_set(err, KT_ERR_UNSUPPORTED, "the model (%s) has no multi-token-prediction block (Qwen 3.5 files "
                         "carry one unless converted without it)", m->llm->cfg.arch);
            kt_session_free(s);
            return NULL;
        }
        llm_mtp_kv_params(m->llm, &kp); /* its KV layer after the trunk's */
        const size_t E = (size_t)m->llm->cfg.n_embd;
        s->mtp = true;
        s->mtp_h = calloc(E, sizeof(float));
        s->mtp_rows = malloc(sizeof(float) * E * LLM_MAX_BATCH);
        s->mtp_in = malloc(sizeof(float) * E * LLM_MAX_BATCH);
        if (!s->mtp_h || !s->mtp_rows || !s->mtp_in) {
            kt_error_set(err, KT_ERR_NOMEM, "out of memory");
            kt_session_free(s);
            return NULL;
        }
    }
    const size_t kv_bytes = kv_params_bytes(&kp), avail = kt_mem_budget();
    if (avail && kv_bytes > avail) {
        kt_error_set(err, KT_ERR_NOMEM, "a context of %d positions needs %zu MiB of KV cache but %zu MiB of memory are "
                     "available now: lower -c", n_ctx, kv_bytes >> 20, avail >> 20);
        kt_session_free(s);
        return NULL;
    }
    if (!(s->kv = kv_pool_new(&kp, err)) || !(s->seq = kv_seq_new(s->kv, err)) ||
        !(s->work = llm_work_new(m->llm, n_ctx, err)) ||
        !(s->pool = kt_pool_new(p ? p->n_threads : 0, err))) {
        kt_session_free(s);
        return NULL;
    }
    return s;
}

void kt_session_free(kt_session *s) {
    if (!s) return;
    req_images_release(&s->images, NULL);
    free(s->mtp_h), free(s->mtp_rows), free(s->mtp_in);
    if (s->rw) eng_rewind_free(s->rw), free(s->rw);
    kv_seq_free(s->seq);
    kv_pool_free(s->kv);
    llm_work_free(s->work);
    kt_pool_free(s->pool);
    free(s);
}

int kt_session_n_ctx(const kt_session *s) {
    return s->n_ctx;
}

int kt_session_n_past(const kt_session *s) {
    return s->seq->len;
}

void kt_session_truncate(kt_session *s, int n_keep) {
    /* an image is kept whole or not at all: cut before one n_keep splits */
    while (s->images.n && n_keep >= 0 && n_keep < s->images.v[s->images.n - 1].at + s->images.v[s->images.n - 1].n_tokens)
        n_keep = n_keep < s->images.v[s->images.n - 1].at ? n_keep : s->images.v[s->images.n - 1].at, s->images.n--;
    if (n_keep >= 0 && kv_seq_truncate(s->seq, n_keep, NULL) != KT_OK) {
        kv_seq_truncate(s->seq, 0, NULL); /* the window layers gave back what n_keep attends: start over */
        s->images.n = 0;
    }
    kt_session_mtp_cut(s, s->seq->len);
}

void kt_session_mtp_cut(kt_session *s, int n_keep) {
    if (!s->mtp) return;
    const size_t E = (size_t)s->model->llm->cfg.n_embd;
    const int row = n_keep - 1 - s->mtp_base;
    if (n_keep > 0 && row >= 0 && row < s->mtp_n) memcpy(s->mtp_h, s->mtp_rows + (size_t)row * E, sizeof(float) * E);
    else memset(s->mtp_h, 0, sizeof(float) * E); /* not known: the MTP guesses without it */
    if (n_keep == 0) s->mtp_n = 0; /* a new start (or a restored file): the last pass's rows are another sequence's */
}

/* The MTP block over a pass's chunk (positions pos0..), its tokens' hidden
 * states in mtp_rows: row i on token i and the hidden state before it. */
static kt_status session_mtp_pass(kt_session *s, const int32_t *tokens, const int *pos, kv_seq **seqs, int n,
                                  kt_error *err) {
    const size_t E = (size_t)s->model->llm->cfg.n_embd;
    memcpy(s->mtp_in, s->mtp_h, sizeof(float) * E);
    memcpy(s->mtp_in + E, s->mtp_rows, sizeof(float) * E * (size_t)(n - 1));
    llm_batch b = {.n_tokens = n, .tokens = tokens, .pos = pos, .seq = seqs};
    kt_status st = llm_mtp_kv(s->model->llm, s->work, s->pool, &b, s->mtp_in, err);
    s->mtp_base = pos[0], s->mtp_n = n;
    memcpy(s->mtp_h, s->mtp_rows + (size_t)(n - 1) * E, sizeof(float) * E);
    return st;
}

/* Tokens [0, n) appended to the sequence and run, LLM_MAX_BATCH at a
 * time (so that window layers give back what each chunk no longer
 * attends before the next is appended); with mtp, the MTP block after
 * each chunk of tokens. An image's rows (embd) make no MTP rows, as in
 * the engine (engine/mtp_engine.h): they are no tokens the block can
 * embed, and a row would cost each of them the last layer; the row after
 * the image reads zeros for its hidden state. */
kt_status kt_session_forward(kt_session *s, const int32_t *tokens, const float *embd, int n, float *logits,
                             bool all_logits, eng_rewind *rw, kt_error *err) {
    if (rw && n > LLM_MAX_BATCH)
        return kt_error_set(err, KT_ERR_INTERNAL, "a verify pass of %d tokens (at most %d)", n, LLM_MAX_BATCH);
    int pos[LLM_MAX_BATCH], pos4[4 * LLM_MAX_BATCH];
    kv_seq *seqs[LLM_MAX_BATCH];
    bool want[LLM_MAX_BATCH], every[LLM_MAX_BATCH];
    const float *rows[LLM_MAX_BATCH];
    const size_t n_row = llm_embd_row_floats(&s->model->llm->cfg); /* an image row: n_embd, + DeepStack's */
    size_t n_vocab = (size_t)s->model->llm->cfg.n_vocab;
    for (int done = 0; done < n;) {
        int chunk = n - done < LLM_MAX_BATCH ? n - done : LLM_MAX_BATCH;
        int pos0 = s->seq->len;
        if (kv_seq_append(s->seq, chunk, err) != KT_OK) return err->status;
        for (int i = 0; i < chunk; i++) {
            pos[i] = pos0 + i;
            seqs[i] = s->seq;
            want[i] = logits && (all_logits || done + i == n - 1);
            rows[i] = embd ? embd + (size_t)(done + i) * n_row : NULL;
            req_images_pos4(&s->images, pos[i], pos4 + 4 * i);
        }
        for (int i = 0; i < chunk; i++) every[i] = true;
        const bool mtp_rows = s->mtp && !embd;
        llm_batch b = {.n_tokens = chunk, .tokens = tokens + done, .pos = pos, .seq = seqs, .logits = want,
                       .pos_mrope = s->images.n ? pos4 : NULL, .embd = embd ? rows : NULL,
                       .rec_log = rw ? rw->b_log : NULL, .rec_from = rw ? rw->b_from : NULL,
                       .rec_to = rw ? rw->b_to : NULL,
                       /* the MTP reads every token's hidden state */
                       .hidden = mtp_rows ? every : NULL, .hidden_out = mtp_rows ? s->mtp_rows : NULL};
        llm_forward(s->model->llm, s->work, s->pool, &b,
                    logits && all_logits ? logits + (size_t)done * n_vocab : logits);
        if (rw) eng_rewind_passed(rw);
        if (mtp_rows && session_mtp_pass(s, tokens + done, pos, seqs, chunk, err) != KT_OK) return err->status;
        if (s->mtp && !mtp_rows) { /* no hidden state known past the image, no rows of this pass */
            memset(s->mtp_h, 0, sizeof(float) * (size_t)s->model->llm->cfg.n_embd);
            s->mtp_n = 0;
        }
        done += chunk;
    }
    return KT_OK;
}

kt_status kt_session_eval(kt_session *s, const int32_t *tokens, int n, float *logits,
                          bool all_logits, kt_error *err) {
    int n_ctx = s->n_ctx, n_vocab = s->model->llm->cfg.n_vocab, n_past = s->seq->len;
    if (n < 0 || (n > 0 && !tokens)) return kt_error_set(err, KT_ERR_ARG, "invalid token array");
    if (n > n_ctx - n_past)
        return kt_error_set(err, KT_ERR_CONTEXT,
                            "%d tokens do not fit: %d of the %d-token context are used (%d free)", n,
                            n_past, n_ctx, n_ctx - n_past);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return kt_error_set(err, KT_ERR_ARG, "token id %d at index %d is outside the vocabulary [0, %d)",
                                tokens[i], i, n_vocab);
    if (n == 0) return KT_OK;
    return kt_session_forward(s, tokens, NULL, n, logits, all_logits, NULL, err);
}

kt_status kt_session_eval_image(kt_session *s, const float *embd, int grid_x, int grid_y, float *logits,
                                kt_error *err) {
    const llm_config *c = &s->model->llm->cfg;
    if (!(c->rope_sections[0] + c->rope_sections[1] + c->rope_sections[2]))
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "the model (%s) takes no images", c->arch);
    if (!embd || grid_x < 1 || grid_y < 1 || grid_x > 4096 || grid_y > 4096)
        return kt_error_set(err, KT_ERR_ARG, "an image needs its embeddings and a grid (%dx%d given)", grid_x, grid_y);
    const int n = grid_x * grid_y, n_past = s->seq->len;
    if (n > s->n_ctx - n_past)
        return kt_error_set(err, KT_ERR_CONTEXT, "an image of %d tokens does not fit: %d of the %d-token context are "
                            "used (%d free)", n, n_past, s->n_ctx, s->n_ctx - n_past);
    req_image *v = realloc(s->images.v, sizeof *v * (size_t)(s->images.n + 1));
    int32_t *zeros = calloc((size_t)n, sizeof *zeros); /* ids stand in only: the rows are the image's */
    if (v) s->images.v = v;
    if (!v || !zeros) return free(zeros), kt_error_set(err, KT_ERR_NOMEM, "out of memory for an image");
    s->images.v[s->images.n++] = (req_image){.at = n_past, .n_tokens = n, .grid_x = grid_x, .grid_y = grid_y,
                                             .n_pos = grid_x > grid_y ? grid_x : grid_y};
    kt_status st = kt_session_forward(s, zeros, embd, n, logits, false, NULL, err);
    free(zeros);
    if (st) kt_session_truncate(s, n_past);
    return st;
}

uint64_t kt_model_kv_fingerprint(const kt_model *m, int kv_type, int block_tokens, int n_ctx) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return 0;
    XXH3_64bits_reset(st);
    const int32_t head[3] = {1 /* format of this fingerprint */, kv_type, block_tokens};
    XXH3_64bits_update(st, head, sizeof head);
    const llm_config *c = &m->llm->cfg;
    if (c->rope_factors_long) { /* hashed only here, so other models keep their fingerprints */
        const int32_t long_factors = n_ctx > c->n_ctx_orig;
        XXH3_64bits_update(st, &long_factors, sizeof long_factors);
    }
    gguf_hash_tensors(m->file, st);
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}
