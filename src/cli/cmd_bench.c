/*
 * cmd_bench.c - `kettle bench`: throughput figures in the spirit of
 * llama-bench, so kettle and llama.cpp can be set side by side.
 *
 *   pp N  one batch of N tokens from an empty cache (prefill, compute-bound)
 *   tg N  N tokens one at a time from an empty cache (decode, memory-bound)
 *   ... @ dD  the same after D tokens of context (-d): what an agent's
 *         later turns feel, where attention reads a long KV cache
 *
 * The KV cache is F16 unless --kv-type says otherwise, as in kettle serve
 * and llama-bench.
 * Each test runs once as warm-up (not counted: page cache, clocks, thread
 * start-up), then -r times; we report mean +- sample stddev, min and
 * median of tokens/s, and for tg the weight bytes streamed per second
 * (model bytes x tokens/s), to compare with `--membw`. Tokens are random
 * ids from a fixed seed: speed depends on shape, not on which tokens.
 *
 * --svg FILE also plots the median tokens/s against the context depth
 * (-d): a prefill panel and a decode panel, a line per model, thread
 * count and test length (bench_plot.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/timing.h"
#include "cli/bench_plot.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "kettle.h"
#include "ops/cpu.h"
#include "ops/pool.h"
#include "ops/probe.h"

#define MAX_LIST 16

typedef enum out_fmt { FMT_MD, FMT_CSV, FMT_JSON } out_fmt;

typedef struct int_list {
    int v[MAX_LIST];
    int n;
} int_list;

typedef struct bench_opts {
    const char *models[MAX_LIST];
    int n_models, reps;
    int_list pp, tg, threads, depth;
    out_fmt fmt;
    kt_load_mode load;
    kt_kv_type kv_type;
    bool membw, peak;
    const char *svg; /* --svg FILE, or NULL */
} bench_opts;

typedef struct bench_result {
    const char *model;
    const kt_model_desc *desc;
    int threads, n_tokens, n_depth, reps;
    const char *kv; /* the KV cache's type */
    bool gen;
    double mean, sd, min, median; /* tokens/s */
} bench_result;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle bench [-m MODEL]... [options]\n"
            "       kettle bench serve ...   load-test an OpenAI-compatible server (see 'kettle bench serve --help')\n"
            "       kettle bench agent ...   agent sessions against a server: TTFT per turn, task time\n"
            "                                (see 'kettle bench agent --help')\n"
            "       kettle bench soak ...    soak and load test: many clients, every kind of request, for\n"
            "                                minutes; checks statuses, hangs, RSS and KV blocks (see\n"
            "                                'kettle bench soak --help')\n"
            "       kettle bench spec ...    speculative decoding against plain decoding in the engine:\n"
            "                                forced acceptance rates, prompt lookup, concurrent streams\n"
            "                                (see 'kettle bench spec --help')\n"
            "       kettle bench grammar ... structured output without a model: schema compile time, mask\n"
            "                                time per token (see 'kettle bench grammar --help')\n"
            "  -m, --model FILE   model to measure (repeatable; OWNER/REPO[:QUANT]: a pulled one)\n"
            "  -p, --n-prompt N   prompt lengths for pp tests, comma-separated (default 512; 0: none)\n"
            "  -n, --n-gen N      generation lengths for tg tests (default 128; 0: none)\n"
            "  -d, --n-depth N    context already in the cache before each test, comma-separated\n"
            "                     (default 0; the context is filled once per test, untimed)\n"
            "  -t, --threads N    thread counts, comma-separated (default: all CPUs)\n"
            "  -r, --repetitions N  runs of each test after the warm-up (default 5)\n"
            "      --md | --csv | --json   output format (default md)\n"
            "      --load MODE    repack (default), copy, mmap or populate (see 'kettle run --help')\n"
            "      --kv-type T    KV cache element type: f16 (default, as kettle serve and llama-bench\n"
            "                     keep it), f32 or q8_0\n"
            "      --membw        measure memory bandwidth (read, triad)\n"
            "      --peak         measure peak fp32 FMA and int8 multiply-add throughput (and AMX\n"
            "                     tile products where the CPU has them)\n"
            "      --svg FILE     also plot median t/s against the depth (-d): prefill and decode\n"
            "                     panels, a line per model, thread count and test length (at most 8)\n");
}

static bool parse_list(const char *s, int lo, int hi, int_list *out) {
    return cli_parse_int_list(s, lo, hi, out->v, MAX_LIST, &out->n);
}

/* Test lengths of a -p / -n list that run (0 means none). */
static int n_nonzero(const int_list *l) {
    int n = 0;
    for (int i = 0; i < l->n; i++) n += l->v[i] != 0;
    return n;
}

static int parse_opts(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.load = KT_LOAD_REPACK, .kv_type = KT_KV_F16, .reps = 5, .pp = {{512}, 1}, .tg = {{128}, 1}, .threads = {{0}, 1},
                        .depth = {{0}, 1}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--md")) o->fmt = FMT_MD;
        else if (!strcmp(a, "--csv")) o->fmt = FMT_CSV;
        else if (!strcmp(a, "--json")) o->fmt = FMT_JSON;
        else if (!strcmp(a, "--membw")) o->membw = true;
        else if (!strcmp(a, "--peak")) o->peak = true;
        else if ((r = cli_opt("bench", argc, argv, &i, "--svg", &o->svg))) {
            if (r < 0) return 2;
        } else if ((r = cli_opt("bench", argc, argv, &i, "-m", &v)) ||
                 (r = cli_opt("bench", argc, argv, &i, "--model", &v))) {
            if (r < 0) return 2;
            if (o->n_models == MAX_LIST) return cli_usage_error("bench", "at most %d models", MAX_LIST);
            o->models[o->n_models++] = v;
        } else if ((r = cli_opt("bench", argc, argv, &i, "-p", &v)) ||
                   (r = cli_opt("bench", argc, argv, &i, "--n-prompt", &v))) {
            if (r < 0 || !parse_list(v, 0, 1 << 16, &o->pp)) return r < 0 ? 2 : cli_usage_error("bench", "bad -p '%s'", v);
        } else if ((r = cli_opt("bench", argc, argv, &i, "-n", &v)) ||
                   (r = cli_opt("bench", argc, argv, &i, "--n-gen", &v))) {
            if (r < 0 || !parse_list(v, 0, 1 << 16, &o->tg)) return r < 0 ? 2 : cli_usage_error("bench", "bad -n '%s'", v);
        } else if ((r = cli_opt("bench", argc, argv, &i, "-d", &v)) ||
                   (r = cli_opt("bench", argc, argv, &i, "--n-depth", &v))) {
            if (r < 0 || !parse_list(v, 0, 1 << 20, &o->depth)) return r < 0 ? 2 : cli_usage_error("bench", "bad -d '%s'", v);
        } else if ((r = cli_opt("bench", argc, argv, &i, "-t", &v)) ||
                   (r = cli_opt("bench", argc, argv, &i, "--threads", &v))) {
            if (r < 0 || !parse_list(v, 1, 1024, &o->threads)) return r < 0 ? 2 : cli_usage_error("bench", "bad -t '%s'", v);
        } else if ((r = cli_opt("bench", argc, argv, &i, "--kv-type", &v))) {
            if (r < 0) return 2;
            if (!strcmp(v, "f16")) o->kv_type = KT_KV_F16;
            else if (!strcmp(v, "f32")) o->kv_type = KT_KV_F32;
            else if (!strcmp(v, "q8_0")) o->kv_type = KT_KV_Q8_0;
            else return cli_usage_error("bench", "bad --kv-type '%s' (f16, f32, q8_0)", v);
        } else if ((r = cli_opt("bench", argc, argv, &i, "--load", &v))) {
            if (r < 0 || !cli_parse_load_mode(v, &o->load)) return r < 0 ? 2 : cli_usage_error("bench", "bad --load '%s'", v);
        } else if ((r = cli_opt("bench", argc, argv, &i, "-r", &v)) ||
                   (r = cli_opt("bench", argc, argv, &i, "--repetitions", &v))) {
            int_list l;
            if (r < 0 || !parse_list(v, 1, 1000, &l) || l.n != 1) return r < 0 ? 2 : cli_usage_error("bench", "bad -r '%s'", v);
            o->reps = l.v[0];
        } else {
            return cli_usage_error("bench", "unknown option '%s'", a);
        }
    }
    if (!o->n_models && !o->membw && !o->peak)
        return cli_usage_error("bench", "nothing to measure: give -m MODEL, --membw or --peak");
    if (o->svg && !o->n_models) return cli_usage_error("bench", "--svg plots model tests: give -m MODEL");
    int most = n_nonzero(&o->pp) > n_nonzero(&o->tg) ? n_nonzero(&o->pp) : n_nonzero(&o->tg);
    if (o->svg && o->n_models * o->threads.n * most > BP_MAX_SERIES)
        return cli_usage_error("bench", "--svg draws at most %d lines a panel; %d models x %d thread counts x %d test "
                               "lengths make %d", BP_MAX_SERIES, o->n_models, o->threads.n, most,
                               o->n_models * o->threads.n * most);
    return 0;
}

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void summarize(double *v, int n, bench_result *r) {
    double sum = 0, ss = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    r->mean = sum / n;
    for (int i = 0; i < n; i++) ss += (v[i] - r->mean) * (v[i] - r->mean);
    r->sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    r->min = v[0];
    r->median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- one test ---- */

/* Seconds for one run after `depth` tokens of context (already in the
 * cache: truncating to it keeps them): pp evaluates all tokens in one
 * call, tg one by one. */
static double run_once(kt_session *s, int depth, const int32_t *toks, int n, bool gen, float *logits,
                       kt_error *err) {
    kt_session_truncate(s, depth);
    const int kept = kt_session_n_past(s); /* sliding-window layers may have given the depth back: refill it */
    if (kept < depth && kt_session_eval(s, toks + n + kept, depth - kept, NULL, false, err) != KT_OK) return -1;
    double t0 = kt_time_ms();
    kt_status st = KT_OK;
    if (gen) {
        for (int i = 0; i < n && st == KT_OK; i++) st = kt_session_eval(s, toks + i, 1, logits, false, err);
    } else {
        st = kt_session_eval(s, toks, n, logits, false, err);
    }
    return st == KT_OK ? (kt_time_ms() - t0) / 1e3 : -1;
}

static kt_status run_test(kt_model *m, int threads, int n, int depth, kt_kv_type kv, bool gen, int reps,
                          bench_result *r, kt_error *err) {
    const kt_model_desc *d = kt_model_describe(m);
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = depth + n, .n_threads = threads, .kv_type = kv}, err);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(depth + n));
    float *logits = malloc(sizeof(float) * (size_t)d->n_vocab);
    double *tps = malloc(sizeof(double) * (size_t)reps);
    kt_status st = s ? KT_OK : err->status;
    if (st == KT_OK && (!toks || !logits || !tps)) st = KT_ERR_NOMEM, snprintf(err->msg, sizeof err->msg, "out of memory");
    if (st == KT_OK) {
        kt_rng rng;
        kt_rng_seed(&rng, 42);
        for (int i = 0; i < depth + n; i++) toks[i] = (int32_t)(kt_rng_u64(&rng) % (uint64_t)d->n_vocab);
        if (depth > 0) st = kt_session_eval(s, toks + n, depth, NULL, false, err); /* the context, once */
    }
    /* warm-up: llama-bench's rule, the whole prompt or one generated token */
    if (st == KT_OK && run_once(s, depth, toks, gen ? 1 : n, gen, logits, err) < 0) st = err->status;
    for (int i = 0; st == KT_OK && i < reps; i++) {
        double sec = run_once(s, depth, toks, n, gen, logits, err);
        if (sec < 0) st = err->status;
        else tps[i] = n / sec;
    }
    if (st == KT_OK) {
        r->threads = threads, r->n_tokens = n, r->n_depth = depth, r->gen = gen, r->reps = reps, r->desc = d;
        r->kv = kv == KT_KV_F32 ? "f32" : kv == KT_KV_Q8_0 ? "q8_0" : "f16";
        summarize(tps, reps, r);
    }
    free(tps), free(logits), free(toks);
    kt_session_free(s);
    return st;
}

/* ---- output ---- */

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* "1.10 B", "135.0 M", "0.26 M": llama-bench's style, readable at any size. */
static const char *params_text(uint64_t n, char *buf, size_t cap) {
    if (n >= 1000000000ull) snprintf(buf, cap, "%.2f B", n / 1e9);
    else snprintf(buf, cap, "%.2f M", n / 1e6);
    return buf;
}

static void print_header(out_fmt f) {
    if (f == FMT_MD) {
        printf("| model | size | params | threads | test | t/s | min | median | weights GB/s |\n");
        printf("|---|---:|---:|---:|---|---:|---:|---:|---:|\n");
    } else if (f == FMT_CSV) {
        printf("model,size_bytes,n_params,threads,test,n_tokens,n_depth,reps,ts_mean,ts_stddev,ts_min,ts_median,weights_gbs,kv_type\n");
    }
}

static void print_result(out_fmt f, const bench_result *r, bool first) {
    char test[48];
    if (r->n_depth) snprintf(test, sizeof test, "%s%d @ d%d", r->gen ? "tg" : "pp", r->n_tokens, r->n_depth);
    else snprintf(test, sizeof test, "%s%d", r->gen ? "tg" : "pp", r->n_tokens);
    double gbs = r->gen ? r->median * (double)r->desc->active_bytes / 1e9 : 0; /* what a token reads (model.h) */
    if (f == FMT_MD) {
        char size[32], params[32];
        printf("| %s | %s | %s | %d | %s | %.2f ± %.2f | %.2f | %.2f | ", base_name(r->model),
               cli_human_bytes(r->desc->weight_bytes, size, sizeof size),
               params_text(r->desc->n_params, params, sizeof params),
               r->threads, test, r->mean, r->sd, r->min, r->median);
        if (r->gen) printf("%.2f |\n", gbs);
        else printf("|\n");
    } else if (f == FMT_CSV) {
        printf("\"%s\",%llu,%llu,%d,%s,%d,%d,%d,%.9g,%.9g,%.9g,%.9g,%.9g,%s\n", base_name(r->model),
               (unsigned long long)r->desc->weight_bytes, (unsigned long long)r->desc->n_params, r->threads,
               test, r->n_tokens, r->n_depth, r->reps, r->mean, r->sd, r->min, r->median, gbs, r->kv);
    } else {
        printf("%s  {\"model\": \"%s\", \"size_bytes\": %llu, \"active_bytes\": %llu, \"n_params\": %llu, \"threads\": %d, "
               "\"test\": \"%s\", \"n_tokens\": %d, \"n_depth\": %d, \"reps\": %d, \"ts_mean\": %.9g, \"ts_stddev\": %.9g, "
               "\"ts_min\": %.9g, \"ts_median\": %.9g, \"weights_gbs\": %.9g, \"kv_type\": \"%s\"}",
               first ? "" : ",\n", base_name(r->model), (unsigned long long)r->desc->weight_bytes,
               (unsigned long long)r->desc->active_bytes, (unsigned long long)r->desc->n_params, r->threads, test, r->n_tokens, r->n_depth, r->reps, r->mean,
               r->sd, r->min, r->median, gbs, r->kv);
    }
    fflush(stdout);
}

/* ---- --svg ---- */

static const char *const COLORS[BP_MAX_SERIES] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                  "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

/* Empty panels (pp, tg) with one x tick per depth; the series are named
 * as results come (plot_add). */
static void plot_init(bp_plot *p, const bench_opts *o) {
    *p = (bp_plot){.n_x = o->depth.n, .x_label = "context depth (tokens)",
                   .caption = "kettle bench: median tokens/s"};
    for (int i = 0; i < o->depth.n; i++) snprintf(p->x_tick[i], sizeof p->x_tick[i], "%d", o->depth.v[i]);
    p->panels[0] = (bp_panel){.title = "Prefill (pp)", .y_label = "tokens/s"};
    p->panels[1] = (bp_panel){.title = "Decode (tg)", .y_label = "tokens/s"};
}

/* Series names live here: bp_series holds pointers. */
static char g_series_names[2][BP_MAX_SERIES][96];

/* Result r at depth index di into line `series` of its panel; bench_models
 * numbers the lines by model, thread count and test length, so a line is
 * the same at every depth. */
static void plot_add(bp_plot *p, const bench_result *r, int series, int di) {
    bp_panel *pa = &p->panels[r->gen ? 1 : 0];
    if (series >= BP_MAX_SERIES) return; /* parse_opts refused such a plot */
    bp_series *s = &pa->s[series];
    if (series >= pa->n_series) {
        pa->n_series = series + 1;
        snprintf(g_series_names[r->gen][series], sizeof g_series_names[0][0], "%.60s %s%d t%d", base_name(r->model),
                 r->gen ? "tg" : "pp", r->n_tokens, r->threads);
        s->name = g_series_names[r->gen][series], s->color = COLORS[series];
    }
    s->v[di] = r->median;
}

/* The panels that have lines, written to o->svg. */
static int plot_write(bp_plot *p, const bench_opts *o) {
    if (!p->panels[0].n_series) p->panels[0] = p->panels[1], p->panels[1] = (bp_panel){0};
    p->n_panels = p->panels[1].n_series ? 2 : 1;
    if (bp_write_svg(o->svg, p)) return 0;
    fprintf(stderr, "kettle bench: cannot write %s: %s\n", o->svg, strerror(errno));
    return 1;
}

static int threads_or_default(int t) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return t > 0 ? t : n > 0 ? (int)n : 1;
}

static int bench_models(const bench_opts *o, bp_plot *plot) {
    bool first = true;
    int rc = 0;
    for (int mi = 0; mi < o->n_models && rc == 0; mi++) {
        kt_error err = {0};
        const char *model = o->models[mi];
        char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
        if (ms_resolve_opt("bench", &model, model_path, sizeof model_path)) return 1;
        kt_model *m = cli_load_model(model, o->load, &err);
        if (!m) return cli_fail("bench", &err);
        for (int ti = 0; ti < o->threads.n && rc == 0; ti++) {
            const int_list *lists[2] = {&o->pp, &o->tg};
            for (int di = 0; di < o->depth.n && rc == 0; di++)
                for (int g = 0; g < 2 && rc == 0; g++)
                    for (int k = 0, nth = 0; k < lists[g]->n && rc == 0; k++) {
                        if (lists[g]->v[k] == 0) continue;
                        int series = (mi * o->threads.n + ti) * n_nonzero(lists[g]) + nth++;
                        bench_result r = {.model = o->models[mi]};
                        if (run_test(m, threads_or_default(o->threads.v[ti]), lists[g]->v[k], o->depth.v[di],
                                     o->kv_type, g == 1, o->reps, &r, &err))
                            rc = cli_fail("bench", &err);
                        else print_result(o->fmt, &r, first), first = false;
                        if (rc == 0 && plot) plot_add(plot, &r, series, di);
                    }
        }
        kt_model_free(m);
    }
    return rc;
}

/* ---- machine ceilings ---- */

static int bench_machine(const bench_opts *o) {
    for (int ti = 0; ti < o->threads.n; ti++) {
        int threads = threads_or_default(o->threads.v[ti]);
        kt_error err = {0};
        kt_pool *pool = kt_pool_new(threads, &err);
        if (!pool) return cli_fail("bench", &err);
        if (o->membw) {
            kt_membw bw;
            if (kt_probe_membw(pool, (size_t)256 << 20, 5, &bw, &err)) {
                kt_pool_free(pool);
                return cli_fail("bench", &err);
            }
            fprintf(stderr, "memory bandwidth, %d threads: read %.1f GB/s, triad %.1f GB/s\n", threads,
                    bw.read_gbs, bw.triad_gbs);
        }
        if (o->peak) {
            fprintf(stderr, "peak, %d threads: fp32 FMA %.1f GFLOP/s, int8 multiply-add %.1f GOP/s (%s)\n",
                    threads, kt_probe_peak_fma(pool), kt_probe_peak_int8(pool),
                    kt_cpu_has_avx512_vnni() ? "512-bit FMA, vpdpbusd" : "256-bit FMA, maddubs");
            const double amx = kt_probe_peak_amx_bf16(pool);
            if (amx > 0) /* the vision tower's split takes three products for one (ops/amx.h) */
                fprintf(stderr, "peak, %d threads: AMX bf16 tiles %.1f GFLOP/s (%.1f of the vision tower's split)\n",
                        threads, amx, amx / 3);
        }
        kt_pool_free(pool);
    }
    return 0;
}

int cmd_bench(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "serve")) return cmd_bench_serve(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "agent")) return cmd_bench_agent(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "soak")) return cmd_bench_soak(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "grammar")) return cmd_bench_grammar(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "spec")) return cmd_bench_spec(argc - 1, argv + 1);
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    bench_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    /* ceilings go to stderr, so --json/--csv output stays one document */
    if ((o.membw || o.peak) && (rc = bench_machine(&o))) return rc;
    if (!o.n_models) return 0;
    if (o.fmt == FMT_JSON) printf("[\n");
    print_header(o.fmt);
    static bp_plot plot; /* ~13 KB: off the stack */
    if (o.svg) plot_init(&plot, &o);
    rc = bench_models(&o, o.svg ? &plot : NULL);
    if (o.fmt == FMT_JSON) printf("\n]\n");
    if (!rc && o.svg) rc = plot_write(&plot, &o);
    return rc;
}
