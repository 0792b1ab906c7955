/*
 * cmd_template.c - `kettle template`: print the prompt a chat template
 * renders for a message list: what users need when a model misbehaves
 * ("is it the template or the model?").
 *
 * The template comes from a model's `tokenizer.chat_template` (-m), from a
 * Jinja file, or by built-in name (--template). Variables: messages, tools,
 * add_generation_prompt, bos_token / eos_token (the model's, or --bos /
 * --eos), date_string (today), plus any given with --context FILE.json.
 * Tool-call arguments sent as JSON strings (the OpenAI convention) are
 * parsed to objects first, as chat templates expect.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "gguf/gguf.h"
#include "text/chat.h"
#include "text/chat_builtin.h"
#include "text/vocab.h"

typedef struct tmpl_opts {
    const char *model, *template, *messages, *tools, *context, *bos, *eos;
    bool no_gen_prompt;
} tmpl_opts;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle template (-m MODEL | --template FILE.jinja|NAME) --messages FILE.json [options]\n"
            "  -m, --model FILE        use the model's own chat template and BOS/EOS texts\n"
            "      --template T        a Jinja file, or a built-in: %s\n"
            "      --messages FILE     JSON list of messages (or an object with \"messages\", \"tools\")\n"
            "      --tools FILE        JSON list of tool definitions\n"
            "      --context FILE      JSON object of extra template variables\n"
            "      --bos S, --eos S    texts of bos_token / eos_token\n"
            "      --no-generation-prompt   do not open an assistant turn at the end\n",
            kt_chat_builtin_names());
}

static int parse_opts(int argc, char **argv, tmpl_opts *o) {
    *o = (tmpl_opts){0};
    struct {
        const char *name;
        const char **dst;
    } opts[] = {{"-m", &o->model}, {"--model", &o->model}, {"--template", &o->template},
                {"--messages", &o->messages}, {"--tools", &o->tools}, {"--context", &o->context},
                {"--bos", &o->bos}, {"--eos", &o->eos}};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-generation-prompt")) {
            o->no_gen_prompt = true;
            continue;
        }
        int r = 0;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0] && !r; k++)
            r = cli_opt("template", argc, argv, &i, opts[k].name, opts[k].dst);
        if (r < 0) return 2;
        if (!r) return cli_usage_error("template", "unknown option '%s'", argv[i]);
    }
    if (!o->model && !o->template) /* both: the model gives BOS/EOS, the file the template */
        return cli_usage_error("template", "need -m MODEL or --template FILE|NAME");
    if (!o->messages) return cli_usage_error("template", "need --messages FILE.json");
    return 0;
}

/* ---- inputs ---- */

static json_t *load_json(const char *path, kt_error *err) {
    json_error_t jerr;
    json_t *j = json_load_file(path, JSON_DECODE_ANY, &jerr);
    if (!j) kt_error_set(err, KT_ERR_ARG, "%s:%d: %s", path, jerr.line, jerr.text);
    return j;
}


static char *copy_piece(const kt_vocab *v, int id) {
    size_t len = 0;
    const char *p = id >= 0 ? kt_vocab_piece(v, id, &len) : "";
    char *s = malloc(len + 1);
    if (s) memcpy(s, p, len), s[len] = 0;
    return s;
}

/* The model's template text and BOS/EOS texts (malloc'ed). */
static kt_status model_template(const char *path, char **tmpl, char **bos, char **eos, kt_error *err) {
    gguf_file *f = gguf_open(path, err);
    if (!f) return err->status;
    kt_status st = KT_OK;
    int64_t k = gguf_find_key(f, "tokenizer.chat_template");
    gguf_str s;
    kt_vocab *v = kt_vocab_from_gguf(f, err);
    if (!v) st = kt_error_wrap(err, "%s", path);
    else if (k < 0 || !gguf_kv_get_str(f, k, &s))
        st = kt_error_set(err, KT_ERR_ARG, "%s has no chat template; name one with --template (%s)", path,
                          kt_chat_builtin_names());
    else if (!(*tmpl = strndup(s.ptr, s.len)) || !(*bos = copy_piece(v, kt_vocab_bos(v))) ||
             !(*eos = copy_piece(v, kt_vocab_eos(v))))
        st = kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    kt_vocab_free(v);
    gguf_close(f);
    return st;
}

static char *named_template(const char *name, kt_error *err) {
    size_t len;
    char *text = cli_read_file(name, &len);
    if (text) return text;
    const char *builtin = kt_chat_builtin(name);
    if (builtin) return strdup(builtin);
    kt_error_set(err, KT_ERR_ARG, "template '%s' is neither a readable file (%s) nor a built-in (%s)", name,
                 strerror(errno), kt_chat_builtin_names());
    return NULL;
}

/* ---- rendering ---- */

static json_t *make_context(const tmpl_opts *o, const char *bos, const char *eos, kt_error *err) {
    json_t *ctx = o->context ? load_json(o->context, err) : json_object();
    if (!ctx) return NULL;
    if (!json_is_object(ctx)) {
        json_decref(ctx);
        kt_error_set(err, KT_ERR_ARG, "%s: expected a JSON object of variables", o->context);
        return NULL;
    }
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%d %b %Y", localtime(&now));
    if (!json_object_get(ctx, "date_string")) json_object_set_new(ctx, "date_string", json_string(date));
    if (!json_object_get(ctx, "bos_token")) json_object_set_new(ctx, "bos_token", json_string(o->bos ? o->bos : bos));
    if (!json_object_get(ctx, "eos_token")) json_object_set_new(ctx, "eos_token", json_string(o->eos ? o->eos : eos));
    return ctx;
}

static int render(const tmpl_opts *o, const char *tmpl, const char *bos, const char *eos) {
    kt_error err = {0};
    json_t *doc = load_json(o->messages, &err), *tools = NULL, *ctx = NULL;
    json_t *messages = json_is_object(doc) ? json_object_get(doc, "messages") : doc;
    if (doc && !json_is_array(messages))
        kt_error_set(&err, KT_ERR_ARG, "%s: expected a list of messages", o->messages), messages = NULL;
    if (messages && o->tools) tools = load_json(o->tools, &err);
    else if (messages && json_is_object(doc)) tools = json_incref(json_object_get(doc, "tools"));
    if (messages && (!o->tools || tools)) ctx = make_context(o, bos, eos, &err);
    char *text = NULL;
    if (ctx && !kt_chat_parse_tool_arguments(messages)) kt_error_set(&err, KT_ERR_NOMEM, "out of memory");
    else if (ctx) text = kt_chat_render(tmpl, messages, tools, !o->no_gen_prompt, ctx, &err);
    if (text) fputs(text, stdout);
    free(text);
    json_decref(ctx), json_decref(tools), json_decref(doc);
    return text ? 0 : cli_fail("template", &err);
}

int cmd_template(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    tmpl_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt("template", &o.model, model_path, sizeof model_path)) return 1;
    kt_error err = {0};
    char *tmpl = NULL, *bos = NULL, *eos = NULL;
    kt_status st = KT_OK;
    if (o.model) st = model_template(o.model, &tmpl, &bos, &eos, &err);
    if (st == KT_OK && o.template) {
        free(tmpl);
        if (!(tmpl = named_template(o.template, &err))) st = err.status;
    }
    rc = st ? cli_fail("template", &err) : render(&o, tmpl, bos ? bos : "", eos ? eos : "");
    free(tmpl), free(bos), free(eos);
    return rc;
}
