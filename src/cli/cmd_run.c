/*
 * cmd_run.c - `kettle run`: generate text from a prompt, streaming it.
 *
 * The generated text (not the prompt) goes to stdout as it is produced;
 * timings go to stderr, so `kettle run ... > out.txt` captures exactly the
 * continuation. Generation stops at N tokens, at the end-of-sequence token,
 * or when the context is full (said on stderr, never silently).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timing.h"
#include "cli/cli_images.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "kettle.h"

typedef struct run_opts {
    cli_gen_opts g;
    const char *prompt, *prompt_file;
    bool no_bos;
    bool spec;       /* --spec ngram|draft|mtp: speculative decoding */
    bool mtp;        /* --spec mtp: the model's own MTP block proposes */
    bool spec_auto;  /* --spec auto without --draft: mtp if the model has the block, else ngram */
    const char *draft; /* --draft PATH: the draft model (--spec draft) */
    kt_model *draft_model;
    int draft_max;   /* --draft-max K: most tokens proposed per step (0: 8) */
    bool spec_fixed; /* --spec-fixed: always verify what the lookup finds (no adaptive k) */
    const char *mmproj; /* --mmproj PATH: the vision tower */
    const char *images[CLI_MAX_IMAGES]; /* --image FILE, in prompt order */
    int n_images;
    kt_vision *vision;
} run_opts;

static void run_usage(FILE *out) {
    fprintf(out,
            "usage: kettle run -m MODEL (-p PROMPT | -f FILE) [options]\n"
            "  -p, --prompt TEXT     prompt text\n"
            "  -f, --file FILE       read the prompt from a file ('-': standard input)\n"
            "      --no-bos          do not add the beginning-of-sequence token\n"
            "      --spec off|ngram|draft|mtp|auto  speculative decoding: ngram verifies what the\n"
            "                        context predicts (prompt lookup) in one pass; draft: what a smaller\n"
            "                        model of the same vocabulary (--draft PATH) guesses; mtp: what the\n"
            "                        model's own multi-token-prediction block guesses (Qwen 3.5); auto:\n"
            "                        draft with --draft, else mtp where the model has the block, else\n"
            "                        ngram; the output is the same, token for token, at any temperature\n"
            "                        (default off here; kettle serve's is auto)\n"
            "      --draft PATH      the draft model (implies --spec draft)\n"
            "      --draft-max K     most tokens proposed per step (default 8; k adapts to the measured\n"
            "                        acceptance and cost unless --spec-fixed)\n"
            "      --mmproj PATH     the model's vision projector (llama.cpp's mmproj GGUF)\n"
            "      --image FILE      a PNG, JPEG or WebP image (repeatable, with --mmproj): it goes where the\n"
            "                        prompt says " CLI_IMAGE_MARKER ", or before the prompt; the prompt's control\n"
            "                        tokens (<|im_start|>) are then read as such\n"
            "%s",
            cli_gen_usage());
}

/* Returns 0 on success, 2 on a usage error (already reported). */
static int parse_opts(int argc, char **argv, run_opts *o) {
    *o = (run_opts){0};
    cli_gen_defaults(&o->g);
    const char *spec_kind = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "--no-bos")) o->no_bos = true;
        else if (!strcmp(argv[i], "--spec-fixed")) o->spec_fixed = true;
        else if ((r = cli_opt("run", argc, argv, &i, "--spec", &v))) {
            if (r < 0) return 2;
            if (strcmp(v, "off") && strcmp(v, "ngram") && strcmp(v, "draft") && strcmp(v, "mtp") && strcmp(v, "auto"))
                return cli_usage_error("run", "invalid --spec '%s' (off, ngram, draft, mtp, auto)", v);
            o->spec = strcmp(v, "off") != 0, spec_kind = v;
        } else if ((r = cli_opt("run", argc, argv, &i, "--draft", &v))) {
            if (r < 0) return 2;
            o->draft = v;
        } else if ((r = cli_opt("run", argc, argv, &i, "--mmproj", &v))) {
            if (r < 0) return 2;
            o->mmproj = v;
        } else if ((r = cli_opt("run", argc, argv, &i, "--image", &v))) {
            if (r < 0) return 2;
            if (o->n_images == CLI_MAX_IMAGES) return cli_usage_error("run", "at most %d --image files", CLI_MAX_IMAGES);
            o->images[o->n_images++] = v;
        } else if ((r = cli_opt("run", argc, argv, &i, "--draft-max", &v))) {
            if (r < 0) return 2;
            if (!cli_parse_int(v, 1, 32, &o->draft_max)) return cli_usage_error("run", "invalid --draft-max '%s' (1..32)", v);
        } else if ((r = cli_gen_opt("run", argc, argv, &i, &o->g))) {
            if (r != 1) return r;
        } else if ((r = cli_opt("run", argc, argv, &i, "-p", &v)) || (r = cli_opt("run", argc, argv, &i, "--prompt", &v))) {
            if (r < 0) return 2;
            o->prompt = v;
        } else if ((r = cli_opt("run", argc, argv, &i, "-f", &v)) || (r = cli_opt("run", argc, argv, &i, "--file", &v))) {
            if (r < 0) return 2;
            o->prompt_file = v;
        } else {
            return cli_usage_error("run", "unknown option '%s'", argv[i]);
        }
    }
    if (!o->g.model || (!o->prompt == !o->prompt_file))
        return cli_usage_error("run", "need -m MODEL and one of -p PROMPT or -f FILE");
    if (o->draft && !spec_kind) spec_kind = "draft", o->spec = true;
    /* auto without --draft: mtp where the model has the block, decided once it is loaded (run_main) */
    if (spec_kind && !strcmp(spec_kind, "auto")) spec_kind = o->draft ? "draft" : "auto";
    o->mtp = spec_kind && !strcmp(spec_kind, "mtp");
    o->spec_auto = spec_kind && !strcmp(spec_kind, "auto");
    if (spec_kind && !strcmp(spec_kind, "draft") && !o->draft) return cli_usage_error("run", "--spec draft needs --draft PATH");
    if (o->draft && strcmp(spec_kind, "draft")) return cli_usage_error("run", "--draft goes with --spec draft");
    if ((o->draft_max || o->spec_fixed) && !o->spec)
        return cli_usage_error("run", "--draft-max and --spec-fixed need --spec ngram, draft or mtp");
    if (o->n_images && !o->mmproj) return cli_usage_error("run", "--image needs the model's vision projector (--mmproj PATH)");
    if (o->n_images && o->spec) return cli_usage_error("run", "--spec does not go with --image yet");
    return 0;
}

/* Tokenizes the prompt into a malloc'ed array; returns the count or -1. */
static int tokenize_prompt(const kt_model *m, const char *text, size_t len, int bos, int32_t **ids,
                           kt_error *err) {
    int n = kt_tokenize(m, text, len, NULL, 0, bos, err);
    if (n < 0) return -1;
    *ids = malloc(((size_t)n + 1) * sizeof **ids);
    if (!*ids) {
        snprintf(err->msg, sizeof err->msg, "out of memory for %d prompt tokens", n);
        return -1;
    }
    return kt_tokenize(m, text, len, *ids, n, bos, err);
}

typedef struct run_stats {
    double load_ms, prefill_ms, ttft_ms, decode_ms, encode_ms;
    int n_prompt, n_gen, n_image_tokens;
    bool spec;
    const char *spec_source; /* what proposed: "prompt lookup", "the draft model", "the MTP block" */
    kt_spec_stats spec_stats;
} run_stats;

static void print_stats(const run_stats *st) {
    fprintf(stderr, "\n\nload time:     %8.1f ms\n", st->load_ms);
    fprintf(stderr, "prompt tokens: %8d\n", st->n_prompt);
    if (st->n_image_tokens)
        fprintf(stderr, "image tokens:  %8d (the vision tower took %.1f ms)\n", st->n_image_tokens, st->encode_ms);
    fprintf(stderr, "TTFT:          %8.1f ms\n", st->ttft_ms);
    fprintf(stderr, "prefill:       %8.2f tok/s (%d tokens in %.1f ms)\n",
            st->prefill_ms > 0 ? st->n_prompt * 1e3 / st->prefill_ms : 0.0, st->n_prompt, st->prefill_ms);
    int n_decoded = st->n_gen > 0 ? st->n_gen - 1 : 0; /* the first token came from prefill */
    fprintf(stderr, "decode:        %8.2f tok/s (%d tokens in %.1f ms)\n",
            st->decode_ms > 0 ? n_decoded * 1e3 / st->decode_ms : 0.0, n_decoded, st->decode_ms);
    if (!st->spec) return;
    const kt_spec_stats *ss = &st->spec_stats;
    fprintf(stderr, "speculation:   %8llu passes, %llu tokens proposed, %llu accepted (%.1f%%) by %s\n",
            (unsigned long long)ss->steps, (unsigned long long)ss->proposed, (unsigned long long)ss->accepted,
            ss->proposed ? 100.0 * (double)ss->accepted / (double)ss->proposed : 0.0, st->spec_source);
    if (ss->lookup_proposed) /* MTP with prompt lookup beside it: each source's share */
        fprintf(stderr, "               of them by prompt lookup: %llu proposed, %llu accepted; by the MTP block: %llu, "
                "%llu\n", (unsigned long long)ss->lookup_proposed, (unsigned long long)ss->lookup_accepted,
                (unsigned long long)(ss->proposed - ss->lookup_proposed),
                (unsigned long long)(ss->accepted - ss->lookup_accepted));
}

/* Emits one token; false when it ends the reply (EOS, or -n reached). */
static bool emit(const kt_model_desc *d, kt_detok *dt, const run_opts *o, int32_t tok, run_stats *st) {
    st->n_gen++;
    if (tok == d->eos_id) return false;
    fputs(kt_detok_push(dt, tok), stdout);
    fflush(stdout);
    return o->g.n_predict < 0 || st->n_gen < o->g.n_predict;
}

/* --spec ngram|draft: each step evaluates the pending token with what the
 * context predicts after it (or the draft guesses); the tokens are plain
 * decoding's. */
static int generate_spec(kt_model *m, kt_session *s, kt_sampler *smp, const run_opts *o, float *logits,
                         const int32_t *prompt, int n_prompt, double t_start, run_stats *st) {
    const kt_model_desc *d = kt_model_describe(m);
    const int cap = kt_session_n_ctx(s) + 40;
    int32_t *ctx = malloc(sizeof *ctx * (size_t)cap), out[33];
    kt_detok *dt = kt_detok_new(m);
    kt_error err = {0};
    kt_spec *sp = ctx && dt ? kt_spec_new(m, &(kt_spec_params){.k_max = o->draft_max, .fixed_k = o->spec_fixed,
                                                                  .draft = o->draft_model, .draft_threads = o->g.n_threads,
                                                                  .mtp = o->mtp}, &err)
                            : NULL;
    int rc = 0;
    if (!sp) {
        fprintf(stderr, "kettle run: %s\n", err.msg[0] ? err.msg : "out of memory");
        rc = 1;
        goto done;
    }
    memcpy(ctx, prompt, sizeof *ctx * (size_t)n_prompt);
    int n = n_prompt;
    int32_t tok = kt_sampler_sample(smp, logits);
    kt_sampler_accept(smp, tok);
    st->ttft_ms = kt_time_ms() - t_start;
    double t_decode = kt_time_ms();
    ctx[n++] = tok;
    for (bool more = emit(d, dt, o, tok, st); more;) {
        int got = kt_spec_step(sp, s, smp, ctx, n, out, &err);
        if (got < 0) {
            if (err.status == KT_ERR_CONTEXT) fprintf(stderr, "\n[stopped: the context is full]");
            else fprintf(stderr, "\nkettle run: %s\n", err.msg), rc = 1;
            break;
        }
        for (int i = 0; i < got && more && n < cap; i++) ctx[n++] = out[i], more = emit(d, dt, o, out[i], st);
    }
    st->decode_ms = kt_time_ms() - t_decode;
    st->spec = true, st->spec_stats = kt_spec_get_stats(sp);
    st->spec_source = o->mtp ? "the MTP block with prompt lookup" : o->draft_model ? "the draft model" : "prompt lookup";
    fputs(kt_detok_flush(dt), stdout);
    fflush(stdout);
done:
    kt_spec_free(sp);
    kt_detok_free(dt);
    free(ctx);
    return rc;
}

/* Samples, streams and evaluates until a stop; returns 0 or 1. */
static int generate(kt_model *m, kt_session *s, kt_sampler *smp, const run_opts *o, float *logits,
                    double t_start, run_stats *st) {
    const kt_model_desc *d = kt_model_describe(m);
    kt_detok *dt = kt_detok_new(m);
    if (!dt) {
        fprintf(stderr, "kettle run: out of memory\n");
        return 1;
    }
    kt_error err = {0};
    double t_decode = 0;
    int rc = 0;
    for (int i = 0; o->g.n_predict < 0 || i < o->g.n_predict; i++) {
        int32_t tok = kt_sampler_sample(smp, logits);
        if (i == 0) st->ttft_ms = kt_time_ms() - t_start, t_decode = kt_time_ms();
        kt_sampler_accept(smp, tok);
        st->n_gen++;
        if (tok == d->eos_id) break;
        fputs(kt_detok_push(dt, tok), stdout);
        fflush(stdout);
        if (o->g.n_predict >= 0 && i + 1 == o->g.n_predict) break;
        if (kt_session_eval(s, &tok, 1, logits, false, &err)) {
            if (err.status == KT_ERR_CONTEXT) fprintf(stderr, "\n[stopped: the context is full]");
            else fprintf(stderr, "\nkettle run: %s\n", err.msg), rc = 1;
            break;
        }
    }
    fputs(kt_detok_flush(dt), stdout);
    fflush(stdout);
    if (st->n_gen > 0) st->decode_ms = kt_time_ms() - t_decode;
    kt_detok_free(dt);
    return rc;
}

static int run_model(kt_model *m, const run_opts *o, const char *text, size_t len, run_stats *st) {
    const kt_model_desc *d = kt_model_describe(m);
    kt_error err = {0};
    int32_t *ids = NULL;
    float *logits = malloc((size_t)d->n_vocab * sizeof(float));
    cli_warn_ctx("run", m, o->g.n_ctx);
    run_opts local = *o; /* --spec auto: mtp where the model has the block */
    if (local.spec_auto) local.mtp = kt_model_has_mtp(m);
    o = &local;
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = o->g.n_ctx, .n_threads = o->g.n_threads, .mtp = o->mtp},
                                   &err);
    kt_sampler *smp = s ? kt_sampler_new(&o->g.sp, d->n_vocab, &err) : NULL;
    int rc = 1;
    if (!logits || !s || !smp) goto done;
    if (o->n_images) {
        cli_image_stats is;
        double t_img = kt_time_ms();
        if (cli_images_eval(m, s, o->vision, o->g.n_threads, o->images, o->n_images, text, len, o->no_bos ? 0 : -1,
                            logits, &is, &err))
            goto done;
        st->n_prompt = is.n_tokens, st->prefill_ms = kt_time_ms() - t_img - is.encode_ms, st->encode_ms = is.encode_ms;
        st->n_image_tokens = is.n_image_tokens;
        rc = generate(m, s, smp, o, logits, t_img, st);
        err.msg[0] = 0;
        goto done;
    }
    st->n_prompt = tokenize_prompt(m, text, len, o->no_bos ? 0 : -1, &ids, &err);
    if (st->n_prompt < 0) goto done;
    if (st->n_prompt == 0) {
        snprintf(err.msg, sizeof err.msg, "the prompt is empty (and no BOS token is added)");
        goto done;
    }
    for (int i = 0; i < st->n_prompt; i++) kt_sampler_accept(smp, ids[i]);
    double t0 = kt_time_ms();
    if (kt_session_eval(s, ids, st->n_prompt, logits, false, &err)) goto done;
    st->prefill_ms = kt_time_ms() - t0;
    rc = o->spec ? generate_spec(m, s, smp, o, logits, ids, st->n_prompt, t0, st) : generate(m, s, smp, o, logits, t0, st);
    err.msg[0] = 0;
done:
    if (rc && err.msg[0]) fprintf(stderr, "kettle run: %s\n", err.msg);
    else if (rc && !logits) fprintf(stderr, "kettle run: out of memory\n");
    free(ids);
    free(logits);
    kt_sampler_free(smp);
    kt_session_free(s);
    return rc;
}

int cmd_run(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        run_usage(stdout);
        return 0;
    }
    run_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt("run", &o.g.model, model_path, sizeof model_path)) return 1;
    size_t len = 0;
    char *file_text = NULL;
    if (o.prompt_file && !(file_text = cli_read_file(o.prompt_file, &len))) {
        fprintf(stderr, "kettle run: cannot read prompt file '%s': %s\n", o.prompt_file, strerror(errno));
        return 1;
    }
    const char *text = file_text ? file_text : o.prompt;
    if (!file_text) len = strlen(text);
    kt_error err = {0};
    run_stats st = {0};
    double t0 = kt_time_ms();
    kt_model *m = cli_load_model(o.g.model, o.g.load, &err);
    st.load_ms = kt_time_ms() - t0;
    if (!m) {
        fprintf(stderr, "kettle run: %s\n", err.msg);
        free(file_text);
        return 1;
    }
    if (o.mmproj && !(o.vision = cli_vision_load(o.mmproj, m, &err))) {
        fprintf(stderr, "kettle run: the vision projector %s: %s\n", o.mmproj, err.msg);
        kt_model_free(m);
        free(file_text);
        return 1;
    }
    if (o.draft && !(o.draft_model = cli_load_model(o.draft, o.g.load, &err))) {
        fprintf(stderr, "kettle run: the draft model %s: %s\n", o.draft, err.msg);
        kt_model_free(m);
        free(file_text);
        return 1;
    }
    rc = run_model(m, &o, text, len, &st);
    if (rc == 0) print_stats(&st);
    if (rc == 0 && o.g.sp.temperature > 0) /* what repeats this run */
        fprintf(stderr, "seed:          %llu%s\n", (unsigned long long)o.g.sp.seed, o.g.seed_given ? "" : " (drawn; --seed repeats it)");
    kt_model_free(o.draft_model);
    kt_vision_free(o.vision);
    kt_model_free(m);
    free(file_text);
    return rc;
}
