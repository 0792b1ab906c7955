/*
 * cmd_tokenize.c - `kettle tokenize`: show how a model's tokenizer splits a
 * text. The first thing to look at when a model misbehaves on some input:
 * one wrong token silently degrades every answer.
 *
 * Output (default): one token a line, "id<TAB>'piece'" with the piece's
 * decoded bytes escaped; --ids prints "[1, 2, 3]"; --pieces the pieces
 * only. The vocabulary comes from a model (-m) or a vocab-only GGUF
 * (--vocab): only tokenizer.* metadata is read, so any architecture works.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "gguf/gguf.h"
#include "text/vocab.h"

typedef enum out_mode { OUT_TABLE, OUT_IDS, OUT_PIECES } out_mode;

typedef struct tok_opts {
    const char *model, *text, *file;
    out_mode mode;
    int bos; /* -1: the model's rule */
    bool specials;
} tok_opts;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle tokenize (-m MODEL | --vocab VOCAB.gguf) [options] (TEXT | -f FILE)\n"
            "  -m, --model FILE    model whose tokenizer to use (or OWNER/REPO[:QUANT], pulled)\n"
            "      --vocab FILE    vocab-only GGUF (same thing, no weights needed)\n"
            "  -f, --file FILE     read the text from FILE ('-': standard input)\n"
            "      --ids           print the ids only, as a list\n"
            "      --pieces        print the pieces only, one a line\n"
            "      --no-bos        do not add the beginning-of-sequence token\n"
            "      --bos           add it even if the model does not\n"
            "      --specials      match control tokens written in the text (\"<|im_end|>\"),\n"
            "                      as for a rendered chat template; off by default, so\n"
            "                      text cannot smuggle them in\n");
}

static int parse_opts(int argc, char **argv, tok_opts *o) {
    *o = (tok_opts){.bos = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--ids")) o->mode = OUT_IDS;
        else if (!strcmp(a, "--pieces")) o->mode = OUT_PIECES;
        else if (!strcmp(a, "--no-bos")) o->bos = 0;
        else if (!strcmp(a, "--bos")) o->bos = 1;
        else if (!strcmp(a, "--specials")) o->specials = true;
        else if ((r = cli_opt("tokenize", argc, argv, &i, "--model", &v)) ||
                 (r = cli_opt("tokenize", argc, argv, &i, "-m", &v)) ||
                 (r = cli_opt("tokenize", argc, argv, &i, "--vocab", &v))) {
            if (r < 0) return 2;
            if (o->model) return cli_usage_error("tokenize", "give one of -m or --vocab");
            o->model = v;
        } else if ((r = cli_opt("tokenize", argc, argv, &i, "--file", &v)) ||
                   (r = cli_opt("tokenize", argc, argv, &i, "-f", &v))) {
            if (r < 0) return 2;
            o->file = v;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("tokenize", "unknown option '%s'", a);
        } else if (o->text) {
            return cli_usage_error("tokenize", "more than one TEXT (quote it)");
        } else {
            o->text = a;
        }
    }
    if (!o->model) return cli_usage_error("tokenize", "need -m MODEL or --vocab VOCAB.gguf");
    if (!o->text == !o->file) return cli_usage_error("tokenize", "give TEXT or -f FILE (one of them)");
    return 0;
}

/* Writes bytes with C-style escapes for anything not printable ASCII or
 * UTF-8 (so control bytes and partial characters stay visible). */
static void print_escaped(const char *s, int n) {
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\'' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

static void print_tokens(const kt_vocab *v, const int32_t *ids, int n, out_mode mode) {
    if (mode == OUT_IDS) {
        putchar('[');
        for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        puts("]");
        return;
    }
    char piece[256];
    for (int i = 0; i < n; i++) {
        int len = kt_vocab_decode_piece(v, ids[i], piece, sizeof piece);
        if (len > (int)sizeof piece) len = sizeof piece;
        const char *text = piece;
        if (len == 0) { /* a control token decodes to nothing: show its name */
            size_t raw_len;
            text = kt_vocab_piece(v, ids[i], &raw_len);
            len = (int)raw_len;
        }
        if (mode == OUT_TABLE) printf("%6d\t'", ids[i]);
        print_escaped(text, len);
        puts(mode == OUT_TABLE ? "'" : "");
    }
}

static int tokenize_text(const kt_vocab *v, const char *text, size_t len, const tok_opts *o) {
    kt_error err = {0};
    bool bos = o->bos < 0 ? kt_vocab_add_bos(v) : o->bos == 1;
    int n = kt_vocab_encode_ex(v, text, len, bos, o->specials, NULL, 0, &err);
    if (n < 0) return cli_fail("tokenize", &err);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) return cli_fail("tokenize", &(kt_error){KT_ERR_NOMEM, "out of memory"});
    n = kt_vocab_encode_ex(v, text, len, bos, o->specials, ids, n, &err);
    if (n >= 0) print_tokens(v, ids, n, o->mode);
    free(ids);
    return n < 0 ? cli_fail("tokenize", &err) : 0;
}

int cmd_tokenize(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    tok_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt("tokenize", &o.model, model_path, sizeof model_path)) return 1;
    size_t len = 0;
    char *file_text = NULL;
    if (o.file && !(file_text = cli_read_file(o.file, &len))) {
        fprintf(stderr, "kettle tokenize: cannot read '%s': %s\n", o.file, strerror(errno));
        return 1;
    }
    kt_error err = {0};
    gguf_file *f = gguf_open(o.model, &err);
    kt_vocab *v = f ? kt_vocab_from_gguf(f, &err) : NULL;
    if (f && !v) kt_error_wrap(&err, "%s", o.model);
    rc = v ? tokenize_text(v, file_text ? file_text : o.text, file_text ? len : strlen(o.text), &o)
           : cli_fail("tokenize", &err);
    kt_vocab_free(v);
    gguf_close(f);
    free(file_text);
    return rc;
}
