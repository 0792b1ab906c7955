/*
 * cmd_bench_spec.c - `kettle bench spec`: what speculative decoding buys
 * in the engine kettle serve runs, against plain decoding, in one sitting.
 *
 * For each stream count S, S requests run at once in one engine (the
 * prompt: a file's tokens, or random ones, each stream's with its own last
 * token), each generating -n tokens greedily; the figure is the decode
 * throughput, all streams' tokens over the time from the last stream's
 * first token to the last one's end. First plain decoding (speculation
 * off), whose outputs are kept; then each mode:
 *
 *   --accept A,B,..  proposals from the plain run's own outputs, spoiled
 *         so that a fraction A of the proposed tokens is right (the first
 *         round(A x k) of each, carried over so the rate is exact), which
 *         makes the acceptance of an agent turn that reproduces its
 *         context measurable on a random-weight model;
 *   --ngram  the engine's own proposers (prompt lookup, the table);
 *   --mtp    the model's MTP block (Qwen 3.5), with prompt lookup beside
 *         it; with --accept, the forced modes run with the MTP block too:
 *         its rows every step and its guesses made (and paid for), then
 *         replaced by the oracle's, so the rates carry the MTP's cost.
 *
 * Every run's outputs are compared with plain decoding's ("identical").
 * Each run gets a fresh engine (the table starts empty); the modes take
 * turns within each round (bench_streams).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "cli/bench_serve.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "engine/engine.h"
#include "kettle.h"

#define MAX_LIST 16
#define MAX_STREAMS 64

typedef struct bs_opts {
    const char *model, *prompt_file;
    int n_prompt, n_gen, reps, threads, k_max;
    int streams[MAX_LIST], n_streams;
    float accept[MAX_LIST];
    int n_accept;
    bool ngram, fixed, mtp;
} bs_opts;

/* One run's streams. */
typedef struct bs_run {
    int32_t *out[MAX_STREAMS];
    int n_out[MAX_STREAMS];
    double tps;
    kt_engine_stats st;
} bs_run;

/* The oracle of --accept: each stream's plain output after its prompt. */
typedef struct bs_oracle {
    const int32_t *prompt[MAX_STREAMS];
    int n_prompt;
    const bs_run *plain;
    int n_streams, n_vocab;
    double rate, carry;
} bs_oracle;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle bench spec -m MODEL [options]\n"
            "  -p, --n-prompt N     random prompt tokens (default 512; ignored with --prompt-file)\n"
            "      --prompt-file F  the prompt: this file's text (e.g. a source file an agent edits)\n"
            "  -n, --n-gen N        tokens each stream generates (default 128)\n"
            "      --streams LIST   concurrent streams, comma-separated (default 1)\n"
            "      --accept LIST    forced acceptance rates in [0, 1], comma-separated: proposals from\n"
            "                       plain decoding's own output, that fraction of them right\n"
            "      --ngram          the engine's own proposers (prompt lookup, cross-request table)\n"
            "      --mtp            the model's multi-token-prediction block (Qwen 3.5); with --accept the\n"
            "                       forced modes pay for its rows and guesses as --spec mtp would\n"
            "      --draft-max K    most proposals per stream and step (default 8)\n"
            "      --spec-fixed     verify every proposal (no adaptive k)\n"
            "  -t, --threads N      forward-pass threads (default: all CPUs)\n"
            "  -r, --repetitions N  rounds, each running every mode once in turn (default 3);\n"
            "                       medians reported\n");
}

static bool parse_rates(const char *s, float *v, int *n) {
    for (*n = 0; *s && *n < MAX_LIST; (*n)++) {
        char *end;
        double x = strtod(s, &end);
        if (end == s || !(x >= 0 && x <= 1) || (*end && *end != ',')) return false;
        v[*n] = (float)x, s = *end ? end + 1 : end;
    }
    return *n > 0 && !*s;
}

static int parse(int argc, char **argv, bs_opts *o) {
    *o = (bs_opts){.n_prompt = 512, .n_gen = 128, .reps = 3, .streams = {1}, .n_streams = 1};
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "--ngram")) o->ngram = true;
        else if (!strcmp(argv[i], "--mtp")) o->mtp = true;
        else if (!strcmp(argv[i], "--spec-fixed")) o->fixed = true;
        else if ((r = cli_opt("bench spec", argc, argv, &i, "-m", &v)) || (r = cli_opt("bench spec", argc, argv, &i, "--model", &v))) {
            if (r < 0) return 2;
            o->model = v;
        } else if ((r = cli_opt("bench spec", argc, argv, &i, "--prompt-file", &v))) {
            if (r < 0) return 2;
            o->prompt_file = v;
        } else if ((r = cli_opt("bench spec", argc, argv, &i, "--streams", &v))) {
            if (r < 0 || !cli_parse_int_list(v, 1, MAX_STREAMS, o->streams, MAX_LIST, &o->n_streams))
                return r < 0 ? 2 : cli_usage_error("bench spec", "bad --streams '%s' (1..%d, comma-separated)", v, MAX_STREAMS);
        } else if ((r = cli_opt("bench spec", argc, argv, &i, "--accept", &v))) {
            if (r < 0 || !parse_rates(v, o->accept, &o->n_accept))
                return r < 0 ? 2 : cli_usage_error("bench spec", "bad --accept '%s' (rates in [0, 1], comma-separated)", v);
        } else {
            struct { const char *name, *alias; int lo, hi, *dst; } ints[] = {
                {"--n-prompt", "-p", 1, 1 << 20, &o->n_prompt}, {"--n-gen", "-n", 2, 1 << 20, &o->n_gen},
                {"--repetitions", "-r", 1, 1000, &o->reps}, {"--threads", "-t", 1, 1024, &o->threads},
                {"--draft-max", NULL, 1, 32, &o->k_max}};
            bool taken = false;
            for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !taken; k++) {
                if (!(r = cli_opt("bench spec", argc, argv, &i, ints[k].name, &v)) && ints[k].alias)
                    r = cli_opt("bench spec", argc, argv, &i, ints[k].alias, &v);
                if (!r) continue;
                if (r < 0) return 2;
                if (!cli_parse_int(v, ints[k].lo, ints[k].hi, ints[k].dst))
                    return cli_usage_error("bench spec", "bad %s '%s' (%d..%d)", ints[k].name, v, ints[k].lo, ints[k].hi);
                taken = true;
            }
            if (!taken) return cli_usage_error("bench spec", "unknown option '%s'", argv[i]);
        }
    }
    if (!o->model) return cli_usage_error("bench spec", "need -m MODEL");
    if (!o->n_accept && !o->ngram && !o->mtp)
        return cli_usage_error("bench spec", "need --accept LIST, --ngram or --mtp (what to compare with plain decoding)");
    return 0;
}

/* The plain output's next k tokens for this stream, the first
 * round(rate x k) of them right (the rounding carried to the next call). */
static int oracle_propose(void *ctx, const int32_t *tokens, int n, int k, int32_t *out) {
    bs_oracle *o = ctx;
    const int done = n - o->n_prompt; /* tokens of the output so far, the pending one included */
    for (int s = 0; s < o->n_streams && done >= 1; s++) {
        const int32_t *ref = o->plain->out[s];
        if (done >= o->plain->n_out[s] || tokens[o->n_prompt - 1] != o->prompt[s][o->n_prompt - 1] ||
            memcmp(tokens + o->n_prompt, ref, sizeof *ref * (size_t)done))
            continue;
        const int got = o->plain->n_out[s] - done < k ? o->plain->n_out[s] - done : k;
        memcpy(out, ref + done, sizeof *out * (size_t)got);
        o->carry += o->rate * got;
        const int right = (int)o->carry < got ? (int)o->carry : got;
        o->carry -= right;
        if (right < got) out[right] = (out[right] + 1) % o->n_vocab;
        return got;
    }
    return 0;
}

/* Runs S streams once on a fresh engine; fills run (outputs, tokens/s, stats). */
static int run_streams(kt_model *m, const bs_opts *o, int S, int32_t *const *prompts, int n_prompt, kt_spec_kind spec,
                       bs_oracle *oracle, bs_run *run, kt_error *err) {
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = n_prompt + o->n_gen + 16, p.n_parallel = S, p.n_threads = o->threads;
    p.batch_tokens = p.batch_tokens > S ? p.batch_tokens : S + 64;
    p.spec = spec, p.spec_k_max = o->k_max, p.spec_fixed_k = o->fixed;
    if (oracle) p.spec_propose = oracle_propose, p.spec_propose_ctx = oracle;
    kt_engine *e = kt_engine_new(m, &p, err);
    if (!e) return 1;
    kt_request *rq[MAX_STREAMS];
    for (int s = 0; s < S; s++) {
        kt_gen_params g = kt_gen_defaults();
        g.prompt = prompts[s], g.n_prompt = n_prompt, g.max_tokens = o->n_gen, g.ignore_eos = true;
        if (kt_engine_submit(e, &g, &rq[s], err) != KT_OK) {
            for (int i = 0; i < s; i++) kt_request_free(rq[i]);
            kt_engine_free(e);
            return 1;
        }
    }
    uint64_t t_first = 0, t_end = 0;
    long after_first = 0;
    uint64_t *t_tok = malloc(sizeof *t_tok * (size_t)o->n_gen * (size_t)S);
    int rc = t_tok ? 0 : (kt_error_set(err, KT_ERR_NOMEM, "out of memory"), 1);
    for (int s = 0; s < S && !rc; s++) {
        kt_event ev;
        int got;
        run->n_out[s] = 0;
        while ((got = kt_request_wait(rq[s], &ev, 600000)) == 1) {
            if (ev.finish == KT_FINISH_ERROR) rc = (kt_error_set(err, KT_ERR_INTERNAL, "%s", ev.error), 1);
            if (ev.token < 0 || run->n_out[s] >= o->n_gen) continue;
            t_tok[(size_t)s * (size_t)o->n_gen + (size_t)run->n_out[s]] = ev.t_ns;
            run->out[s][run->n_out[s]++] = ev.token;
        }
        if (run->n_out[s] && t_tok[(size_t)s * (size_t)o->n_gen] > t_first) t_first = t_tok[(size_t)s * (size_t)o->n_gen];
    }
    for (int s = 0; s < S && !rc; s++)
        for (int i = 0; i < run->n_out[s]; i++) {
            uint64_t t = t_tok[(size_t)s * (size_t)o->n_gen + (size_t)i];
            if (t > t_first) after_first++;
            if (t > t_end) t_end = t;
        }
    run->tps = t_end > t_first ? after_first / ((double)(t_end - t_first) / 1e9) : 0;
    kt_engine_get_stats(e, &run->st);
    for (int s = 0; s < S; s++) kt_request_free(rq[s]);
    kt_engine_free(e);
    free(t_tok);
    return rc;
}

static bool same_outputs(const bs_run *a, const bs_run *b, int S) {
    for (int s = 0; s < S; s++)
        if (a->n_out[s] != b->n_out[s] || memcmp(a->out[s], b->out[s], sizeof(int32_t) * (size_t)a->n_out[s])) return false;
    return true;
}

static double median(double *v, int n) {
    bs_sort(v, n);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define MAX_MODES (MAX_LIST + 2)

/* One mode of the table: plain decoding, a forced rate, or the lookup. */
typedef struct bs_mode {
    char name[48];
    kt_spec_kind spec;
    float rate; /* < 0: no oracle */
    double tps[1000], ratio[1000];
    bool identical;
    uint64_t proposed, accepted, steps, tokens;
} bs_mode;

static void print_mode(const bs_opts *o, int S, bs_mode *md, bool reference) {
    char speed[32] = "", rate[32] = "-";
    const double med = median(md->tps, o->reps), lo = md->tps[0];
    if (!reference) snprintf(speed, sizeof speed, "%.2fx", median(md->ratio, o->reps));
    if (md->proposed) snprintf(rate, sizeof rate, "%.1f%%", 100.0 * (double)md->accepted / (double)md->proposed);
    printf("| %d | %s | %.2f | %.2f | %s | %.1f | %.1f | %s | %.2f | %s |\n", S, md->name, med, lo, speed,
           (double)md->proposed / o->reps, (double)md->accepted / o->reps, rate,
           (double)md->tokens / (double)(md->steps ? md->steps : 1),
           reference ? "(reference)" : md->identical ? "yes" : "**NO**");
    fflush(stdout);
}

/* S streams: a first plain run (untimed: the outputs every mode is
 * checked against, and the forced rates' source), then -r rounds, each
 * running every mode once in turn, so a slow spell of the machine falls
 * on all modes alike; "vs plain" is the median of each round's ratio. */
static int bench_streams(kt_model *m, const bs_opts *o, int S, int32_t *const *prompts, int n_prompt, bs_run *ref,
                         bs_run *run) {
    static bs_mode modes[MAX_MODES];
    int n_modes = 0;
    modes[n_modes++] = (bs_mode){.name = "plain", .spec = KT_SPEC_OFF, .rate = -1};
    for (int a = 0; a < o->n_accept; a++) {
        bs_mode *md = &modes[n_modes++];
        *md = (bs_mode){.spec = o->mtp ? KT_SPEC_MTP : KT_SPEC_NGRAM, .rate = o->accept[a]};
        snprintf(md->name, sizeof md->name, "forced %.0f%%%s", 100.0 * o->accept[a], o->mtp ? " (mtp)" : "");
    }
    if (o->ngram) modes[n_modes++] = (bs_mode){.name = "ngram", .spec = KT_SPEC_NGRAM, .rate = -1};
    if (o->mtp) modes[n_modes++] = (bs_mode){.name = "mtp", .spec = KT_SPEC_MTP, .rate = -1};
    kt_error err = {0};
    if (run_streams(m, o, S, prompts, n_prompt, KT_SPEC_OFF, NULL, ref, &err)) return cli_fail("bench spec", &err);
    bs_oracle oracle = {.n_prompt = n_prompt, .plain = ref, .n_streams = S, .n_vocab = kt_model_describe(m)->n_vocab};
    for (int s = 0; s < S; s++) oracle.prompt[s] = prompts[s];
    for (int i = 0; i < n_modes; i++) modes[i].identical = true;
    for (int r = 0; r < o->reps; r++)
        for (int i = 0; i < n_modes; i++) {
            bs_mode *md = &modes[i];
            /* the right count rounded, not floored: at 90% a first one-token probe is right, as 9 in 10 are */
            oracle.rate = md->rate, oracle.carry = 0.5;
            if (run_streams(m, o, S, prompts, n_prompt, md->spec, md->rate >= 0 ? &oracle : NULL, run, &err))
                return cli_fail("bench spec", &err);
            md->tps[r] = run->tps;
            md->ratio[r] = modes[0].tps[r] > 0 ? run->tps / modes[0].tps[r] : 0;
            md->identical = md->identical && same_outputs(ref, run, S);
            md->proposed += run->st.spec_proposed, md->accepted += run->st.spec_accepted;
            md->steps += run->st.steps, md->tokens += run->st.generated_tokens;
        }
    bool all_same = true;
    for (int i = 0; i < n_modes; i++) print_mode(o, S, &modes[i], i == 0), all_same = all_same && modes[i].identical;
    return all_same ? 0 : 1;
}

/* The prompt of each stream: the file's tokens (or random ones), each
 * stream's last token its own, so no two streams are one sequence. */
static int make_prompts(kt_model *m, const bs_opts *o, int32_t **prompts, int *n_prompt, kt_error *err) {
    const int n_vocab = kt_model_describe(m)->n_vocab;
    int32_t *base = NULL;
    int n = o->n_prompt;
    if (o->prompt_file) {
        size_t len = 0;
        char *text = cli_read_file(o->prompt_file, &len);
        if (!text) return kt_error_set(err, KT_ERR_IO, "cannot read --prompt-file %s", o->prompt_file), 1;
        base = malloc(sizeof *base * (len + 2));
        n = base ? kt_tokenize(m, text, len, base, (int)len + 2, true, err) : -1;
        free(text);
        if (n < 2) return free(base), n < 0 ? 1 : (kt_error_set(err, KT_ERR_ARG, "--prompt-file is empty"), 1);
    } else {
        if (!(base = malloc(sizeof *base * (size_t)n))) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), 1;
        kt_rng rng;
        kt_rng_seed(&rng, 42);
        for (int i = 0; i < n; i++) base[i] = (int32_t)(kt_rng_u64(&rng) % (uint64_t)n_vocab);
    }
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (!(prompts[s] = malloc(sizeof *base * (size_t)n))) return free(base), kt_error_set(err, KT_ERR_NOMEM, "out of memory"), 1;
        memcpy(prompts[s], base, sizeof *base * (size_t)n);
        prompts[s][n - 1] = (int32_t)((base[n - 1] + s) % n_vocab);
    }
    free(base);
    *n_prompt = n;
    return 0;
}

int cmd_bench_spec(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) return usage(stdout), 0;
    bs_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    kt_error err = {0};
    const char *model = o.model;
    char model_path[MS_PATH_MAX];
    if (ms_resolve_opt("bench spec", &model, model_path, sizeof model_path)) return 1;
    kt_model *m = cli_load_model(model, KT_LOAD_REPACK, &err);
    if (!m) return cli_fail("bench spec", &err);
    int32_t *prompts[MAX_STREAMS] = {0};
    int n_prompt = 0;
    static bs_run plain, run;
    for (int s = 0; s < MAX_STREAMS; s++) {
        plain.out[s] = malloc(sizeof(int32_t) * (size_t)o.n_gen), run.out[s] = malloc(sizeof(int32_t) * (size_t)o.n_gen);
        if (!plain.out[s] || !run.out[s]) rc = (kt_error_set(&err, KT_ERR_NOMEM, "out of memory"), cli_fail("bench spec", &err));
    }
    if (!rc && make_prompts(m, &o, prompts, &n_prompt, &err)) rc = cli_fail("bench spec", &err);
    if (!rc) {
        printf("%s, prompt %d tokens, %d generated per stream, %s k (at most %d), %d runs each\n\n", model, n_prompt, o.n_gen,
               o.fixed ? "fixed" : "adaptive", o.k_max ? o.k_max : 8, o.reps);
        printf("| streams | mode | decode t/s median | min | vs plain | proposed / run | accepted / run | acceptance | tokens / step | identical |\n");
        printf("|---:|---|---:|---:|---|---:|---:|---|---:|---|\n");
    }
    for (int si = 0; si < o.n_streams && !rc; si++) rc = bench_streams(m, &o, o.streams[si], prompts, n_prompt, &plain, &run);
    for (int s = 0; s < MAX_STREAMS; s++) free(prompts[s]), free(plain.out[s]), free(run.out[s]);
    kt_model_free(m);
    return rc;
}
