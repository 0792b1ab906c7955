/*
 * cmd_chat.c - `kettle chat`: an interactive, multi-turn conversation with
 * the model's chat template.
 *
 * Each turn renders the whole conversation with the template, tokenizes it
 * with control tokens matched (the template writes them as text), and
 * compares it with the tokens already in the KV cache: only the part after the longest common prefix is
 * prefilled, so a turn costs its new tokens, not the whole history. That is
 * the agent-loop property kettle is built around; stderr shows the reuse.
 *
 * Lines: a message, or a command (/help lists them): /clear (or /reset)
 * starts over, keeping --system, with an empty KV cache; /save FILE and
 * /load FILE write and read the conversation as a JSON array of
 * {"role", "content"} messages (what an OpenAI request's "messages"
 * holds; the KV cache is not in it, see --session); /exit or end of input
 * quits. A reply runs until the model ends its turn or the context is
 * full (-n limits it).
 *
 * Ctrl-C during a reply stops the reply, which stays in the conversation
 * as far as it got, and returns to the prompt. At the prompt, Ctrl-C
 * twice in a row (or Ctrl-D) quits. SIGINT only sets a flag, checked
 * once per token; the handler is installed without SA_RESTART, so it also
 * wakes the read of the next line.
 *
 * --session FILE: the conversation and its KV are restored from FILE when
 * it exists, and saved to it on the way out (kt_session_save: checksummed,
 * fingerprinted, written atomically), so the next run's first turn
 * prefills only its new message. A file of another model, or a damaged
 * one, is refused with a message and left as it is. Images are kept as
 * their files' paths in the conversation and their rows in the KV.
 *
 * --mmproj FILE (the model's vision tower): --image FILE and the /image
 * FILE command attach images to the next message (chat_images.h); each is
 * encoded when attached, and an image already in the conversation is
 * reused from the KV cache like the text around it.
 */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timing.h"
#include "cli/chat_images.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "kettle.h"

typedef struct chat_opts {
    cli_gen_opts g;
    const char *template_arg, *system, *session_path;
    const char *mmproj;                 /* --mmproj PATH: the vision tower */
    const char *images[CLI_MAX_IMAGES]; /* --image FILE: with the first message */
    int n_images;
} chat_opts;

typedef struct chat {
    kt_model *model;
    kt_session *session;
    kt_sampler *sampler;
    const char *template_text; /* NULL: the model's own */
    json_t *messages;
    int32_t *kv;  /* the tokens in the session's KV cache, in order */
    int n_kv, cap_kv;
    float *logits;
    const chat_opts *opts;
    kt_vision *vision;   /* NULL: no --mmproj */
    chat_images *images; /* the conversation's images, encoded */
    json_t *pending;     /* image files for the next message */
    chat_span *spans;    /* the last rendered prompt's images */
    int n_spans;
} chat;

/* Set by SIGINT; cleared by whoever acts on it (the reply loop, the prompt). */
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle chat -m MODEL [options]\n"
            "      --chat-template T  a Jinja file or a built-in name (chatml, llama2, llama3,\n"
            "                         mistral, phi3, gemma); default: the model's own\n"
            "      --system TEXT      a system message to start with\n"
            "      --session FILE     restore the conversation and its KV cache from FILE if it\n"
            "                         exists, and save them there when the chat ends\n"
            "      --mmproj PATH      the model's vision projector (llama.cpp's mmproj GGUF)\n"
            "      --image FILE       a PNG, JPEG or WebP image for the first message (repeatable,\n"
            "                         with --mmproj; /image FILE attaches one to the next message)\n"
            "%s"
            "A reply runs to the end of the model's turn or of the context unless -n is given.\n"
            "Type a message per line; /help lists the commands. Ctrl-C stops a reply; Ctrl-C\n"
            "twice at the prompt, Ctrl-D or /exit quits.\n",
            cli_gen_usage());
}

static int parse_opts(int argc, char **argv, chat_opts *o) {
    *o = (chat_opts){0};
    const char *v;
    cli_gen_defaults(&o->g);
    o->g.n_predict = -1; /* a reply ends at the end of the turn */
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_gen_opt("chat", argc, argv, &i, &o->g))) {
            if (r != 1) return r;
        } else if ((r = cli_opt("chat", argc, argv, &i, "--chat-template", &o->template_arg)) ||
                   (r = cli_opt("chat", argc, argv, &i, "--system", &o->system)) ||
                   (r = cli_opt("chat", argc, argv, &i, "--session", &o->session_path)) ||
                   (r = cli_opt("chat", argc, argv, &i, "--mmproj", &o->mmproj))) {
            if (r < 0) return 2;
        } else if ((r = cli_opt("chat", argc, argv, &i, "--image", &v))) {
            if (r < 0) return 2;
            if (o->n_images == CLI_MAX_IMAGES) return cli_usage_error("chat", "at most %d --image files", CLI_MAX_IMAGES);
            o->images[o->n_images++] = v;
        } else {
            return cli_usage_error("chat", "unknown option '%s'", argv[i]);
        }
    }
    if (!o->g.model) return cli_usage_error("chat", "need -m MODEL");
    if (o->n_images && !o->mmproj) return cli_usage_error("chat", "--image needs the model's vision projector (--mmproj PATH)");
    return 0;
}

/* ---- the conversation ---- */

static bool add_message(json_t *messages, const char *role, const char *content) {
    return json_array_append_new(messages, json_pack("{s:s, s:s}", "role", role, "content", content)) == 0;
}

/* A user message with the pending images: a marker for each, then a
 * newline and the text (as a Qwen-VL prompt lays them out), their files
 * in "images". */
static bool add_user_message(chat *c, const char *line) {
    const size_t n = json_array_size(c->pending), mlen = strlen(CLI_IMAGE_MARKER), len = strlen(line);
    if (!n) return add_message(c->messages, "user", line);
    char *content = malloc(n * mlen + 1 + len + 1);
    json_t *msg = content ? json_pack("{s:s}", "role", "user") : NULL;
    bool ok = msg != NULL;
    if (ok) {
        for (size_t i = 0; i < n; i++) memcpy(content + i * mlen, CLI_IMAGE_MARKER, mlen);
        content[n * mlen] = '\n';
        memcpy(content + n * mlen + 1, line, len + 1);
        ok = !json_object_set_new(msg, "content", json_string(content)) &&
             !json_object_set_new(msg, "images", json_deep_copy(c->pending)) &&
             !json_array_append(c->messages, msg);
    }
    json_decref(msg);
    free(content);
    if (ok) json_array_clear(c->pending);
    return ok;
}

static void reset(chat *c) {
    json_array_clear(c->messages);
    json_array_clear(c->pending);
    if (c->opts->system) add_message(c->messages, "system", c->opts->system);
    kt_session_truncate(c->session, 0);
    c->n_kv = 0;
}

static bool kv_push(chat *c, int32_t tok) {
    if (c->n_kv == c->cap_kv) {
        int cap = c->cap_kv ? 2 * c->cap_kv : 1024;
        int32_t *kv = realloc(c->kv, sizeof *kv * (size_t)cap);
        if (!kv) return false;
        c->kv = kv, c->cap_kv = cap;
    }
    c->kv[c->n_kv++] = tok;
    return true;
}

/* The conversation as tokens, with a generation prompt. */
static int render_prompt(chat *c, int32_t **toks, kt_error *err) {
    char *json = json_dumps(c->messages, JSON_COMPACT);
    char *text = json ? kt_chat_apply(c->model, c->template_text, json, NULL, true, err) : NULL;
    free(json);
    if (!text) return -1;
    /* the template writes BOS itself when it wants one */
    char bos[64] = "";
    int bos_id = kt_model_describe(c->model)->bos_id;
    if (bos_id >= 0) kt_token_text(c->model, bos_id, bos, sizeof bos);
    int add_bos = bos[0] && strncmp(text, bos, strlen(bos)) == 0 ? 0 : -1;
    size_t len = strlen(text);
    if (c->images) {
        free(c->spans), c->spans = NULL, c->n_spans = 0;
        int n = chat_images_tokenize(c->images, c->model, text, add_bos, c->messages, toks, &c->spans, &c->n_spans, err);
        free(text);
        return n;
    }
    int n = kt_tokenize_ex(c->model, text, len, NULL, 0, add_bos, true, err);
    *toks = n >= 0 ? malloc(sizeof(int32_t) * ((size_t)n + 1)) : NULL;
    if (n >= 0 && *toks) n = kt_tokenize_ex(c->model, text, len, *toks, n, add_bos, true, err);
    else if (n >= 0) n = -1, snprintf(err->msg, sizeof err->msg, "out of memory");
    free(text);
    return n;
}

/* Runs toks[at, to) (text) into the session and the chat's record. */
static bool eval_text(chat *c, const int32_t *toks, int at, int to, kt_error *err) {
    if (to <= at) return true;
    if (kt_session_eval(c->session, toks + at, to - at, c->logits, false, err)) return false;
    for (int i = at; i < to; i++)
        if (!kv_push(c, toks[i])) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), false;
    return true;
}

/* Brings the KV cache to `toks` (minus what it already holds) and leaves
 * the logits of the last token; the images among them (c->spans) go in as
 * their embeddings. Returns the tokens reused, or -1. */
static int prefill(chat *c, const int32_t *toks, int n, kt_error *err) {
    int common = 0;
    while (common < n && common < c->n_kv && toks[common] == c->kv[common]) common++;
    if (common == n) common = n - 1; /* re-run the last token for its logits */
    kt_session_truncate(c->session, common);
    /* less where sliding-window layers gave positions back, or where common
     * fell inside an image (an image is kept whole or not at all) */
    common = kt_session_n_past(c->session);
    c->n_kv = common;
    int at = common;
    for (int k = 0; k < c->n_spans; k++) {
        const chat_span *sp = &c->spans[k];
        if (sp->at + sp->n <= at) continue; /* in the cache */
        if (!eval_text(c, toks, at, sp->at, err)) return -1;
        if (kt_session_eval_image(c->session, sp->im->embd, sp->im->grid_x, sp->im->grid_y, c->logits, err)) return -1;
        for (int i = sp->at; i < sp->at + sp->n; i++)
            if (!kv_push(c, toks[i])) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), -1;
        at = sp->at + sp->n;
    }
    return eval_text(c, toks, at, n, err) ? common : -1;
}

/* Samples and streams a reply; returns it (malloc'ed) or NULL. */
static char *generate(chat *c, int *n_gen, kt_error *err) {
    kt_detok *dt = kt_detok_new(c->model);
    size_t cap = 256, len = 0;
    char *reply = malloc(cap);
    *n_gen = 0;
    if (!dt || !reply) goto fail;
    reply[0] = 0;
    for (int i = 0; c->opts->g.n_predict < 0 || i < c->opts->g.n_predict; i++) {
        if (g_interrupted) { /* Ctrl-C: the reply so far is kept */
            g_interrupted = 0;
            fprintf(stderr, "\n[stopped]");
            break;
        }
        int32_t tok = kt_sampler_sample(c->sampler, c->logits);
        kt_sampler_accept(c->sampler, tok);
        if (kt_token_is_eog(c->model, tok)) break;
        const char *piece = kt_detok_push(dt, tok);
        size_t pl = strlen(piece);
        if (len + pl + 1 > cap) {
            char *r = realloc(reply, cap = 2 * (len + pl + 1));
            if (!r) goto fail;
            reply = r;
        }
        memcpy(reply + len, piece, pl + 1), len += pl;
        fputs(piece, stdout);
        fflush(stdout);
        (*n_gen)++;
        if (kt_session_eval(c->session, &tok, 1, c->logits, false, err)) {
            if (err->status == KT_ERR_CONTEXT) fprintf(stderr, "\n[the context is full: /clear starts over]");
            break;
        }
        if (!kv_push(c, tok)) goto fail;
    }
    const char *tail = kt_detok_flush(dt);
    fputs(tail, stdout);
    char *r = realloc(reply, len + strlen(tail) + 1);
    if (!r) goto fail;
    strcat(r, tail);
    kt_detok_free(dt);
    return r;
fail:
    if (!err->msg[0]) snprintf(err->msg, sizeof err->msg, "out of memory");
    kt_detok_free(dt);
    free(reply);
    return NULL;
}

/* One user message -> one streamed reply. Returns false on a fatal error. */
static bool turn(chat *c, const char *line) {
    kt_error err = {0};
    int32_t *toks = NULL;
    if (strstr(line, CLI_IMAGE_MARKER)) { /* it would stand for an image */
        fprintf(stderr, "kettle chat: a message cannot hold the text %s (attach images with /image FILE)\n",
                CLI_IMAGE_MARKER);
        return true;
    }
    const size_t n_attached = json_array_size(c->pending);
    if (!add_user_message(c, line)) return false;
    const double t0 = kt_time_ms(), encoded0 = c->images ? chat_images_encode_ms(c->images) : 0;
    int n = render_prompt(c, &toks, &err), reused = n > 0 ? prefill(c, toks, n, &err) : -1;
    free(toks);
    if (reused < 0) { /* e.g. the conversation no longer fits: drop the message (its images too) */
        fprintf(stderr, "kettle chat: %s%s\n", err.msg, n_attached ? " (the message and its images are dropped)" : "");
        json_array_remove(c->messages, json_array_size(c->messages) - 1);
        return err.status != KT_ERR_NOMEM;
    }
    const double encoded_ms = c->images ? chat_images_encode_ms(c->images) - encoded0 : 0;
    double t_prefill = kt_time_ms() - t0;
    int n_gen;
    char *reply = generate(c, &n_gen, &err);
    double t_gen = kt_time_ms() - t0 - t_prefill;
    if (!reply) return false;
    add_message(c->messages, "assistant", reply);
    free(reply);
    fprintf(stderr, "\n[prompt %d tokens: %d reused, %d prefilled in %.0f ms", n, reused, n - reused, t_prefill);
    if (encoded_ms > 0) fprintf(stderr, " (images encoded in %.0f ms)", encoded_ms);
    fprintf(stderr, "; reply %d tokens, %.1f tok/s]\n", n_gen, t_gen > 0 ? n_gen * 1e3 / t_gen : 0.0);
    return true;
}

/* ---- commands ---- */

static void help(void) {
    fprintf(stderr, "commands:\n"
                    "  /help         this list\n"
                    "  /clear        start a new conversation (--system kept; /reset is the same)\n"
                    "  /save FILE    write the conversation to FILE as JSON messages\n"
                    "  /load FILE    replace the conversation with FILE's messages (as /save writes them)\n"
                    "  /image FILE   attach an image to the next message (with --mmproj)\n"
                    "  /exit         quit (so do Ctrl-D and Ctrl-C twice at the prompt)\n"
                    "Ctrl-C during a reply stops it.\n");
}

/* The conversation to path, atomically (a temporary file renamed over it). */
static bool save_messages(const chat *c, const char *path, char *why, size_t cap) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return snprintf(why, cap, "the name is too long"), false;
    if (json_dump_file(c->messages, tmp, JSON_INDENT(2)) != 0) {
        snprintf(why, cap, "cannot write %.300s: %s", tmp, strerror(errno));
        unlink(tmp);
        return false;
    }
    if (rename(tmp, path) != 0) {
        snprintf(why, cap, "cannot rename %.300s.tmp into place: %s", path, strerror(errno));
        unlink(tmp);
        return false;
    }
    return true;
}

/* A JSON array of objects, each with a string "role" (what a template
 * renders), or NULL with why filled. */
static json_t *read_messages(const char *path, char *why, size_t cap) {
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    if (!m) return snprintf(why, cap, "cannot read %.200s: %s (line %d)", path, je.text, je.line), NULL;
    size_t i;
    json_t *msg;
    bool ok = json_is_array(m);
    json_array_foreach(m, i, msg) {
        if (!ok) break;
        ok = json_is_object(msg) && json_is_string(json_object_get(msg, "role"));
    }
    if (!ok) {
        snprintf(why, cap, "%.300s is not a JSON array of messages ({\"role\": ..., \"content\": ...})", path);
        json_decref(m);
        return NULL;
    }
    return m;
}

/* The next turn renders the loaded messages; the KV cache is kept, so a
 * file that starts like the conversation in it reuses that much. */
static void load_messages(chat *c, const char *path) {
    char why[512];
    json_t *m = read_messages(path, why, sizeof why);
    if (!m) {
        fprintf(stderr, "kettle chat: /load: %s\n", why);
        return;
    }
    json_decref(c->messages);
    c->messages = m;
    fprintf(stderr, "[loaded %zu messages from %s]\n", json_array_size(m), path);
}

/* The argument of "/cmd ARG", or NULL when line is not that command. */
static const char *command_arg(const char *line, const char *cmd) {
    size_t n = strlen(cmd);
    if (strncmp(line, cmd, n) || (line[n] && line[n] != ' ')) return NULL;
    const char *a = line + n;
    while (*a == ' ') a++;
    return a;
}

/* /image FILE: encoded now, so a bad file is known before the message. */
static void attach_image(chat *c, const char *path) {
    kt_error err = {0};
    const cli_image *im;
    if (!c->images) fprintf(stderr, "kettle chat: /image needs the model's vision projector (--mmproj PATH)\n");
    else if (!*path) fprintf(stderr, "kettle chat: /image needs a file name\n");
    else if (json_array_size(c->pending) == CLI_MAX_IMAGES)
        fprintf(stderr, "kettle chat: at most %d images go with one message\n", CLI_MAX_IMAGES);
    else if (!(im = chat_images_get(c->images, path, &err))) fprintf(stderr, "kettle chat: %s\n", err.msg);
    else if (json_array_append_new(c->pending, json_string(path))) fprintf(stderr, "kettle chat: out of memory\n");
    else fprintf(stderr, "[image %s: %dx%d, %d tokens; it goes with the next message]\n", path, im->width, im->height,
                 im->grid_x * im->grid_y);
}

typedef enum line_action { LINE_DONE, LINE_QUIT, LINE_MESSAGE } line_action;

/* A line starting with '/': runs the command. */
static line_action run_command(chat *c, const char *line) {
    const char *arg;
    char why[512];
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) return LINE_QUIT;
    if (!strcmp(line, "/help") || !strcmp(line, "/?")) help();
    else if (!strcmp(line, "/clear") || !strcmp(line, "/reset")) reset(c), fprintf(stderr, "[new conversation]\n");
    else if ((arg = command_arg(line, "/save"))) {
        if (!*arg) fprintf(stderr, "kettle chat: /save needs a file name\n");
        else if (save_messages(c, arg, why, sizeof why))
            fprintf(stderr, "[saved %zu messages to %s]\n", json_array_size(c->messages), arg);
        else fprintf(stderr, "kettle chat: /save: %s\n", why);
    } else if ((arg = command_arg(line, "/load"))) {
        if (!*arg) fprintf(stderr, "kettle chat: /load needs a file name\n");
        else load_messages(c, arg);
    } else if ((arg = command_arg(line, "/image"))) {
        attach_image(c, arg);
    } else {
        fprintf(stderr, "kettle chat: unknown command %s (/help lists them; start a message with a space "
                        "to send it as text)\n", line);
    }
    return LINE_DONE;
}

/* Ctrl-C at the prompt: true when it is the second in a row (quit). */
static bool prompt_interrupted(bool *armed) {
    g_interrupted = 0;
    clearerr(stdin);
    if (*armed) return true;
    *armed = true;
    fprintf(stderr, "\n[Ctrl-C again, Ctrl-D or /exit quits]\n");
    return false;
}

static void chat_loop(chat *c) {
    bool tty = isatty(STDIN_FILENO), armed = false;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    for (;;) {
        if (tty) fputs("> ", stdout), fflush(stdout);
        g_interrupted = 0;
        if ((len = getline(&line, &cap, stdin)) < 0) {
            if (g_interrupted && !prompt_interrupted(&armed)) continue;
            break;
        }
        armed = false;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (line[0] == '/') {
            if (run_command(c, line) == LINE_QUIT) break;
            continue;
        }
        if (!turn(c, line)) break;
        putchar('\n');
    }
    free(line);
}

/* ---- --session ---- */

/* "--session: " before err's message (the message already names the file). */
static void session_error(kt_error *err) {
    char msg[sizeof err->msg + 16];
    snprintf(msg, sizeof msg, "--session: %s", err->msg);
    memcpy(err->msg, msg, sizeof err->msg - 1); /* cut to fit, like every message */
    err->msg[sizeof err->msg - 1] = 0;
}

/* The conversation and KV of o.session_path, if the file exists. */
static bool restore_session(chat *c, kt_error *err) {
    const char *path = c->opts->session_path;
    if (!path || access(path, F_OK) != 0) return true;
    int32_t *toks = NULL;
    char *note = NULL;
    int n = 0;
    if (kt_session_load(c->session, path, &toks, &n, &note, err) != KT_OK) {
        session_error(err);
        snprintf(err->msg + strlen(err->msg), sizeof err->msg - strlen(err->msg),
                 " (the file is left as it is: delete it or name another)");
        return false;
    }
    json_error_t je;
    json_t *messages = json_loads(note, 0, &je);
    free(note);
    if (!json_is_array(messages)) {
        json_decref(messages), free(toks);
        kt_session_truncate(c->session, 0);
        snprintf(err->msg, sizeof err->msg, "--session %s: its conversation is not a JSON array of messages", path);
        return false;
    }
    json_decref(c->messages);
    c->messages = messages;
    free(c->kv);
    c->kv = toks, c->n_kv = c->cap_kv = n;
    fprintf(stderr, "[restored %zu messages and %d tokens of KV from %s]\n", json_array_size(messages), n, path);
    return true;
}

static bool save_session(chat *c, kt_error *err) {
    const char *path = c->opts->session_path;
    if (!path) return true;
    char *note = json_dumps(c->messages, JSON_COMPACT);
    int n = c->n_kv < kt_session_n_past(c->session) ? c->n_kv : kt_session_n_past(c->session);
    kt_status st = note ? kt_session_save(c->session, path, c->kv, n, note, err) : KT_ERR_NOMEM;
    free(note);
    if (st != KT_OK) return session_error(err), false;
    fprintf(stderr, "[saved %zu messages and %d tokens of KV to %s]\n", json_array_size(c->messages), n, path);
    return true;
}

/* ---- set-up ---- */

/* --image: the images of the first message, encoded before the chat
 * starts, so a bad file stops it there. */
static bool attach_first_images(chat *c, kt_error *err) {
    reset(c);
    for (int i = 0; i < c->opts->n_images; i++) {
        const cli_image *im = chat_images_get(c->images, c->opts->images[i], err);
        if (!im) return false;
        if (json_array_append_new(c->pending, json_string(c->opts->images[i])))
            return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), false;
        fprintf(stderr, "[image %s: %dx%d, %d tokens; it goes with the first message]\n", c->opts->images[i], im->width,
                im->height, im->grid_x * im->grid_y);
    }
    return true;
}

/* What the user talks to and how to get help, once, on stderr. */
static void banner(const chat *c) {
    const char *name = strrchr(c->opts->g.model, '/');
    const char *tmpl = c->opts->template_arg ? c->opts->template_arg : "the model's own";
    fprintf(stderr, "kettle chat: %s, context %d positions, template %s\n"
                    "kettle chat: /help lists commands; Ctrl-C stops a reply; Ctrl-D or /exit quits\n",
            name ? name + 1 : c->opts->g.model, kt_session_n_ctx(c->session), tmpl);
}

/* SIGINT sets g_interrupted instead of ending the process; no SA_RESTART,
 * so a blocked read of the next line returns (EINTR) and sees it. */
static void catch_sigint(void) {
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

int cmd_chat(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    chat_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt("chat", &o.g.model, model_path, sizeof model_path)) return 1;
    kt_error err = {0};
    chat c = {.opts = &o, .messages = json_array(), .pending = json_array()};
    char *tmpl = o.template_arg ? cli_load_template(o.template_arg, &err) : NULL;
    if ((!o.template_arg || tmpl) && (c.model = cli_load_model(o.g.model, o.g.load, &err))) {
        const kt_model_desc *d = kt_model_describe(c.model);
        c.template_text = tmpl;
        if (!tmpl && !kt_model_chat_template(c.model))
            snprintf(err.msg, sizeof err.msg, "%s has no chat template: name one with --chat-template", o.g.model);
        else if ((cli_warn_ctx("chat", c.model, o.g.n_ctx), true) && (c.session = kt_session_new(c.model, &(kt_session_params){.n_ctx = o.g.n_ctx, .n_threads = o.g.n_threads}, &err)) &&
                 (c.sampler = kt_sampler_new(&o.g.sp, d->n_vocab, &err)) &&
                 (c.logits = malloc(sizeof(float) * (size_t)d->n_vocab)) && c.messages && c.pending &&
                 (!o.mmproj || ((c.vision = cli_vision_load(o.mmproj, c.model, &err)) &&
                                (c.images = chat_images_new(c.vision, o.g.n_threads, &err)))) &&
                 attach_first_images(&c, &err)) {
            err.msg[0] = 0;
            if (o.g.sp.temperature > 0 && !o.g.seed_given)
                fprintf(stderr, "[seed %llu: --seed repeats this conversation]\n", (unsigned long long)o.g.sp.seed);
            if (restore_session(&c, &err)) {
                banner(&c);
                catch_sigint();
                chat_loop(&c);
                save_session(&c, &err);
            }
        }
    }
    rc = err.msg[0] ? cli_fail("chat", &err) : 0;
    free(c.logits), free(c.kv), free(tmpl), free(c.spans);
    json_decref(c.messages);
    json_decref(c.pending);
    chat_images_free(c.images);
    kt_vision_free(c.vision);
    kt_sampler_free(c.sampler);
    kt_session_free(c.session);
    kt_model_free(c.model);
    return rc;
}
