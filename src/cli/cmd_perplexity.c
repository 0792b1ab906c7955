/*
 * cmd_perplexity.c - `kettle perplexity`: the standard check that a
 * quantization or a kernel did not hurt quality, computed the way
 * llama.cpp's llama-perplexity does so the figures compare directly:
 *
 *   tokenize the whole file with BOS; cut it into consecutive chunks of CTX
 *   tokens (a partial last chunk is dropped); in each chunk, replace the
 *   first token by BOS, evaluate the chunk from an empty cache, and score
 *   the tokens of its second half: token j+1 by the logits at j, for j in
 *   [CTX/2, CTX - 1). PPL = exp(mean NLL); its error is PPL times the
 *   standard error of the mean NLL.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timing.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "kettle.h"

typedef struct ppl_opts {
    const char *model, *file;
    long n_ctx, n_threads, max_chunks;
    kt_load_mode load;
} ppl_opts;

typedef struct ppl_sum {
    double nll, nll2; /* sums of -log p and its square */
    long count;
} ppl_sum;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle perplexity -m MODEL -f TEXT [-c CTX] [-t THREADS] [--chunks N]\n"
            "  -c, --ctx-size N   tokens per chunk (default 512)\n"
            "  -t, --threads N    threads (default: all CPUs)\n"
            "      --chunks N     score at most N chunks (default: all)\n"
            "      --load MODE    repack (default), copy, mmap or populate (see 'kettle run --help')\n");
}

static bool parse_num(const char *cmd, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_usage_error(cmd, "invalid number '%s'", s);
        return false;
    }
    *out = v;
    return true;
}

static int parse_opts(int argc, char **argv, ppl_opts *o) {
    *o = (ppl_opts){.n_ctx = 512, .load = KT_LOAD_REPACK};
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if ((r = cli_opt("perplexity", argc, argv, &i, "-m", &v)) ||
            (r = cli_opt("perplexity", argc, argv, &i, "--model", &v))) {
            if (r < 0) return 2;
            o->model = v;
        } else if ((r = cli_opt("perplexity", argc, argv, &i, "-f", &v)) ||
                   (r = cli_opt("perplexity", argc, argv, &i, "--file", &v))) {
            if (r < 0) return 2;
            o->file = v;
        } else if ((r = cli_opt("perplexity", argc, argv, &i, "-c", &v)) ||
                   (r = cli_opt("perplexity", argc, argv, &i, "--ctx-size", &v))) {
            if (r < 0 || !parse_num("perplexity", v, 4, 1 << 20, &o->n_ctx)) return 2;
        } else if ((r = cli_opt("perplexity", argc, argv, &i, "-t", &v)) ||
                   (r = cli_opt("perplexity", argc, argv, &i, "--threads", &v))) {
            if (r < 0 || !parse_num("perplexity", v, 1, 1024, &o->n_threads)) return 2;
        } else if ((r = cli_opt("perplexity", argc, argv, &i, "--load", &v))) {
            if (r < 0) return 2;
            if (!cli_parse_load_mode(v, &o->load)) return cli_usage_error("perplexity", "bad --load '%s'", v);
        } else if ((r = cli_opt("perplexity", argc, argv, &i, "--chunks", &v))) {
            if (r < 0 || !parse_num("perplexity", v, 1, 1L << 30, &o->max_chunks)) return 2;
        } else {
            return cli_usage_error("perplexity", "unknown option '%s'", argv[i]);
        }
    }
    if (!o->model || !o->file) return cli_usage_error("perplexity", "need -m MODEL and -f TEXT");
    return 0;
}

/* -log softmax(logits)[target], in double. */
static double token_nll(const float *logits, int n_vocab, int32_t target) {
    double max = logits[0], sum = 0;
    for (int i = 1; i < n_vocab; i++) max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < n_vocab; i++) sum += exp(logits[i] - max);
    return log(sum) + max - logits[target];
}

/* Evaluates one chunk (its first token already BOS) and adds its
 * second-half NLLs to *s. */
static kt_status score_chunk(kt_session *s, const int32_t *chunk, int n_ctx, int n_vocab, float *logits,
                             ppl_sum *sum, kt_error *err) {
    kt_session_truncate(s, 0);
    kt_status st = kt_session_eval(s, chunk, n_ctx, logits, true, err);
    if (st) return st;
    for (int j = n_ctx / 2; j < n_ctx - 1; j++) {
        double v = token_nll(logits + (size_t)j * n_vocab, n_vocab, chunk[j + 1]);
        sum->nll += v;
        sum->nll2 += v * v;
        sum->count++;
    }
    return KT_OK;
}

static void print_result(const ppl_sum *s, double seconds, long n_tokens) {
    double mean = s->nll / s->count, ppl = exp(mean), se = 0;
    double var = s->nll2 / s->count - mean * mean;
    if (var > 0 && s->count > 1) se = sqrt(var / (s->count - 1));
    printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * se);
    fprintf(stderr, "%ld scored tokens, %ld evaluated in %.2f s (%.1f tok/s)\n", s->count, n_tokens, seconds,
            n_tokens / seconds);
}

static int run_perplexity(kt_model *m, const int32_t *toks, long n_toks, const ppl_opts *o) {
    const kt_model_desc *d = kt_model_describe(m);
    long n_chunks = n_toks / o->n_ctx;
    if (o->max_chunks > 0 && n_chunks > o->max_chunks) n_chunks = o->max_chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "kettle perplexity: the text has %ld tokens, fewer than one %ld-token chunk (use a smaller -c)\n",
                n_toks, o->n_ctx);
        return 1;
    }
    if (d->bos_id < 0) {
        fprintf(stderr, "kettle perplexity: the model has no BOS token to start chunks with\n");
        return 1;
    }
    kt_error err = {0};
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = (int)o->n_ctx, .n_threads = (int)o->n_threads}, &err);
    float *logits = malloc(sizeof(float) * (size_t)o->n_ctx * (size_t)d->n_vocab);
    int32_t *chunk = malloc(sizeof(int32_t) * (size_t)o->n_ctx);
    int rc = 0;
    if (!s || !logits || !chunk) {
        rc = s ? cli_fail("perplexity", &(kt_error){KT_ERR_NOMEM, "out of memory"}) : cli_fail("perplexity", &err);
    } else {
        ppl_sum sum = {0};
        double t0 = kt_time_ms();
        for (long c = 0; c < n_chunks && rc == 0; c++) {
            memcpy(chunk, toks + c * o->n_ctx, sizeof(int32_t) * (size_t)o->n_ctx);
            chunk[0] = d->bos_id;
            if (score_chunk(s, chunk, (int)o->n_ctx, d->n_vocab, logits, &sum, &err)) rc = cli_fail("perplexity", &err);
            else fprintf(stderr, "[%ld/%ld] running PPL %.4f\n", c + 1, n_chunks, exp(sum.nll / sum.count));
        }
        if (rc == 0) print_result(&sum, (kt_time_ms() - t0) / 1e3, n_chunks * o->n_ctx);
    }
    free(chunk);
    free(logits);
    kt_session_free(s);
    return rc;
}

int cmd_perplexity(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    ppl_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt("perplexity", &o.model, model_path, sizeof model_path)) return 1;
    size_t len = 0;
    char *text = cli_read_file(o.file, &len);
    if (!text) {
        fprintf(stderr, "kettle perplexity: cannot read '%s': %s\n", o.file, strerror(errno));
        return 1;
    }
    kt_error err = {0};
    kt_model *m = cli_load_model(o.model, o.load, &err);
    int32_t *toks = NULL;
    int n = m ? kt_tokenize(m, text, len, NULL, 0, 1, &err) : -1;
    if (n >= 0 && !(toks = malloc(sizeof(int32_t) * ((size_t)n + 1)))) n = -1, snprintf(err.msg, sizeof err.msg, "out of memory");
    if (n >= 0) n = kt_tokenize(m, text, len, toks, n, 1, &err);
    rc = n < 0 ? cli_fail("perplexity", &err) : run_perplexity(m, toks, n, &o);
    free(toks);
    kt_model_free(m);
    free(text);
    return rc;
}
