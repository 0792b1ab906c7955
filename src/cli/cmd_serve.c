/*
 * cmd_serve.c - `kettle serve`: the OpenAI-compatible HTTP server.
 *
 * Loads the model, starts the engine (one thread owning the model and the
 * paged KV cache) and the HTTP server (src/server/), prints one line
 * "kettle serve: listening on http://HOST:PORT" to stderr when requests
 * can be sent, and runs until SIGINT or SIGTERM, then shuts down in order:
 * no new requests, engine stopped (streams end as "cancelled"), daemon
 * stopped, model freed.
 *
 * SIGINT/SIGTERM are blocked before any thread starts and taken with
 * sigwait, so no thread is interrupted by them and no handler runs in a
 * signal context.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"
#include "engine/engine.h"
#include "kettle.h"
#include "server/http.h"

#define MAX_ALIASES 32

typedef struct serve_opts {
    const char *model, *host, *api_key, *template_arg, *kv_type, *prefix_cache, *cache_dir;
    srv_log_format log_format;
    const char *aliases[MAX_ALIASES];
    int n_aliases;
    bool strict_model_names;
    int port, n_ctx, n_parallel, kv_mb, batch_tokens, n_threads, queue_max, http_threads, cache_disk_mb;
    int result_cache;
    kt_load_mode load;
    float itl_stretch;
    bool has_stretch, no_webui;
    const char *embeddings; /* --embeddings [POOLING]: NULL off, "" the file's pooling or mean */
    /* --fallback URL and its settings (server/fallback.h) */
    const char *fallback, *fallback_key_env, *fallback_on, *fallback_model;
    int fallback_timeout_s, fallback_max_s;
} serve_opts;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle serve -m MODEL [options]\n"
            "  -m, --model FILE        GGUF model, or OWNER/REPO[:QUANT] pulled with kettle pull\n"
            "      --host ADDR         address to bind (default 127.0.0.1: this machine only)\n"
            "      --port N            port (default 8080; 0: any free port, printed)\n"
            "  -c, --ctx N             positions per sequence, prompt + output (default: the model's training\n"
            "                          context, at most 4096)\n"
            "      --parallel N        sequences decoding at once; each choice counts (default 16)\n"
            "      --kv-mb N           KV cache budget in MiB (default: parallel x ctx positions)\n"
            "      --batch-tokens N    tokens per engine step, decode + prefill (default 256)\n"
            "      --queue N           requests waiting before 503 (default 64)\n"
            "      --itl-stretch X     beside decoding streams, size prefill so a step takes about\n"
            "                          X times a decode-only step (default 1.8; lower: smoother\n"
            "                          streams, slower first token of new prompts; 0: off)\n"
            "      --kv-type T         KV cache element type: f16 (default), q8_0 (half the\n"
            "                          memory; head size a multiple of 32) or f32\n"
            "      --prefix-cache on|off  reuse the KV of earlier prompts and replies that a\n"
            "                          request starts with (default on); cached KV lives in the\n"
            "                          --kv-mb budget and is given back whenever a request needs room\n"
            "      --cache-dir DIR     also keep cached KV on disk under DIR (per model), found again\n"
            "                          after a restart; without it nothing touches the disk\n"
            "      --cache-disk-mb N   at most N MiB of files in --cache-dir (default 10240); the\n"
            "                          least recently used go first\n"
            "      --result-cache N    answer a repeated deterministic request (temperature 0 or an\n"
            "                          explicit seed, no logprobs) from the last N answers, without\n"
            "                          decoding; marked x-kettle-cache: hit (default 0: off)\n"
            "  -t, --threads N         forward-pass threads (default: all CPUs)\n"
            "      --http-threads N    HTTP worker threads (default 4)\n"
            "      --api-key KEY       require 'Authorization: Bearer KEY' (not for /health)\n"
            "      --alias NAME        another name the model answers to and lists in /v1/models\n"
            "                          (repeatable; the file's name stays)\n"
            "      --strict-model-names  a request naming none of the model's names gets 404\n"
            "                          model_not_found (default: any name is this model)\n"
            "      --chat-template T   a Jinja file or a built-in name (chatml, llama2, llama3,\n"
            "                          mistral, phi3, gemma); default: the model's own\n"
            "      --load MODE         repack, copy, mmap or populate (default repack)\n"
            "      --log-format F      the request log on stderr, one line per request: text\n"
            "                          (default), json (one JSON object a line) or off; method,\n"
            "                          path, status, total ms and, for generation, model, prompt /\n"
            "                          cached / generated tokens and time to first token\n"
            "      --log-requests      the same as --log-format text (kept for old scripts)\n"
            "      --no-webui          no chat page at / (a 404 there; the API is unchanged)\n"
            "      --fallback URL      another OpenAI-compatible server (its base URL, e.g.\n"
            "                          http://127.0.0.1:9000/v1) that gets the generation requests\n"
            "                          kettle cannot serve; the answer says x-kettle-served-by: fallback\n"
            "      --fallback-key-env NAME  the environment variable holding its API key, sent as a\n"
            "                          Bearer token (default KETTLE_FALLBACK_API_KEY; unset: no key)\n"
            "      --fallback-on LIST  which refusals forward, a comma list of context (the prompt does\n"
            "                          not fit), busy (the queue is full), unknown-model (with\n"
            "                          --strict-model-names), error (the engine failed) (default: all)\n"
            "      --fallback-model NAME  the model to ask the upstream for (default: the request's)\n"
            "      --fallback-timeout-s N  connect, and a stream's first byte, within N s, else 504\n"
            "                          (default 10)\n"
            "      --fallback-max-s N  a whole forwarded request within N s (default 600)\n"
            "      --embeddings[=P]    answer /v1/embeddings with a generative model too: its last\n"
            "                          hidden states pooled by P, mean (default), last or cls. A file\n"
            "                          that declares a pooling (an embedding model) embeds without it\n"
            "Endpoints: POST /v1/chat/completions, /v1/completions, /tokenize, /detokenize;\n"
            "GET /v1/models, /v1/models/{id}, /health, /metrics; GET / is a chat page\n"
            "(built in, no API key needed to load it; its requests send the key you give it).\n");
}

typedef struct int_option {
    const char *name, *alias;
    long lo, hi;
    int *dst;
} int_option;

/* One option at argv[*i]: 1 taken, 0 unknown, 2 usage error (reported). */
static int take_option(int argc, char **argv, int *i, serve_opts *o) {
    int_option ints[] = {{"--port", NULL, 0, 65535, &o->port},          {"--ctx", "-c", 0, 1 << 24, &o->n_ctx},
                         {"--parallel", NULL, 1, 1024, &o->n_parallel}, {"--kv-mb", NULL, 0, 1 << 24, &o->kv_mb},
                         {"--batch-tokens", NULL, 1, 1 << 20, &o->batch_tokens}, {"--threads", "-t", 1, 1024, &o->n_threads},
                         {"--queue", NULL, 1, 1 << 20, &o->queue_max},  {"--http-threads", NULL, 1, 256, &o->http_threads},
                         {"--cache-disk-mb", NULL, 1, 1 << 30, &o->cache_disk_mb},
                         {"--result-cache", NULL, 0, 1 << 20, &o->result_cache},
                         {"--fallback-timeout-s", NULL, 1, 3600, &o->fallback_timeout_s},
                         {"--fallback-max-s", NULL, 1, 86400, &o->fallback_max_s}};
    struct { const char *name, *alias; const char **dst; } strs[] = {
        {"--model", "-m", &o->model}, {"--host", NULL, &o->host}, {"--api-key", NULL, &o->api_key},
        {"--chat-template", NULL, &o->template_arg}, {"--kv-type", NULL, &o->kv_type},
        {"--prefix-cache", NULL, &o->prefix_cache}, {"--cache-dir", NULL, &o->cache_dir},
        {"--fallback", NULL, &o->fallback}, {"--fallback-key-env", NULL, &o->fallback_key_env},
        {"--fallback-on", NULL, &o->fallback_on}, {"--fallback-model", NULL, &o->fallback_model}};
    const char *v = NULL;
    int r;
    if (!strcmp(argv[*i], "--log-requests")) return o->log_format = SRV_LOG_TEXT, 1;
    if ((r = cli_opt("serve", argc, argv, i, "--log-format", &v))) {
        if (r < 0) return 2;
        return srv_log_format_parse(v, &o->log_format) ? 1 : cli_usage_error("serve", "invalid --log-format '%s' (text, json, off)", v);
    }
    if (!strcmp(argv[*i], "--strict-model-names")) return o->strict_model_names = true, 1;
    if (!strcmp(argv[*i], "--no-webui")) return o->no_webui = true, 1;
    if (!strcmp(argv[*i], "--embeddings")) return o->embeddings = "", 1;
    if (!strncmp(argv[*i], "--embeddings=", 13)) {
        o->embeddings = argv[*i] + 13;
        if (strcmp(o->embeddings, "mean") && strcmp(o->embeddings, "last") && strcmp(o->embeddings, "cls"))
            return cli_usage_error("serve", "invalid --embeddings pooling '%s' (mean, last, cls)", o->embeddings);
        return 1;
    }
    if ((r = cli_opt("serve", argc, argv, i, "--alias", &v))) {
        if (r < 0) return 2;
        if (o->n_aliases == MAX_ALIASES) return cli_usage_error("serve", "at most %d --alias names", MAX_ALIASES);
        if (!v[0]) return cli_usage_error("serve", "--alias needs a non-empty name");
        o->aliases[o->n_aliases++] = v;
        return 1;
    }
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        if ((r = cli_opt("serve", argc, argv, i, ints[k].name, &v)) ||
            (ints[k].alias && (r = cli_opt("serve", argc, argv, i, ints[k].alias, &v)))) {
            if (r < 0) return 2;
            return cli_parse_int(v, ints[k].lo, ints[k].hi, ints[k].dst)
                       ? 1
                       : cli_usage_error("serve", "invalid value '%s' for %s (%ld..%ld)", v, ints[k].name, ints[k].lo,
                                         ints[k].hi);
        }
    for (size_t k = 0; k < sizeof strs / sizeof strs[0]; k++)
        if ((r = cli_opt("serve", argc, argv, i, strs[k].name, strs[k].dst)) ||
            (strs[k].alias && (r = cli_opt("serve", argc, argv, i, strs[k].alias, strs[k].dst))))
            return r < 0 ? 2 : 1;
    if ((r = cli_opt("serve", argc, argv, i, "--itl-stretch", &v))) {
        if (r < 0) return 2;
        o->has_stretch = true;
        return cli_parse_float(v, 0.0f, 100.0f, &o->itl_stretch)
                   ? 1
                   : cli_usage_error("serve", "invalid --itl-stretch '%s' (0 = off, or a factor >= 1, e.g. 1.8)", v);
    }
    if ((r = cli_opt("serve", argc, argv, i, "--load", &v))) {
        if (r < 0) return 2;
        return cli_parse_load_mode(v, &o->load) ? 1 : cli_usage_error("serve", "invalid --load '%s' (mmap, populate, copy, repack)", v);
    }
    return 0;
}

/* The --fallback options together; the key itself is only looked for,
 * never printed. */
static int check_fallback(const serve_opts *o, srv_fallback *fb) {
    char msg[300];
    bool any = o->fallback_key_env || o->fallback_on || o->fallback_model || o->fallback_timeout_s || o->fallback_max_s;
    if (!o->fallback) return any ? cli_usage_error("serve", "the --fallback-* options need --fallback URL") : 0;
    if (!srv_fb_check_url(o->fallback, msg, sizeof msg)) return cli_usage_error("serve", "--fallback: %s", msg);
    *fb = (srv_fallback){.url = o->fallback, .key_env = o->fallback_key_env, .model = o->fallback_model,
                         .timeout_s = o->fallback_timeout_s, .max_s = o->fallback_max_s};
    if (o->fallback_on && !srv_fb_parse_triggers(o->fallback_on, &fb->triggers, msg, sizeof msg))
        return cli_usage_error("serve", "--fallback-on: %s", msg);
    if (o->fallback_model && !o->fallback_model[0]) return cli_usage_error("serve", "--fallback-model must not be empty");
    if (o->fallback_key_env && !srv_fb_check_env_name(o->fallback_key_env))
        return cli_usage_error("serve", "--fallback-key-env '%s' is not an environment variable's name (letters, "
                               "digits, '_'); give the variable's name, not the key", o->fallback_key_env);
    const char *key = o->fallback_key_env ? getenv(o->fallback_key_env) : NULL;
    if (o->fallback_key_env && (!key || !key[0]))
        return cli_usage_error("serve", "--fallback-key-env %s: that environment variable is not set (or empty)",
                               o->fallback_key_env);
    return 0;
}

static int parse_opts(int argc, char **argv, serve_opts *o) {
    *o = (serve_opts){.host = "127.0.0.1", .port = 8080, .load = KT_LOAD_REPACK, .log_format = SRV_LOG_TEXT};
    for (int i = 1; i < argc; i++) {
        int r = take_option(argc, argv, &i, o);
        if (r == 2) return 2;
        if (r == 0) return cli_usage_error("serve", "unknown option '%s'", argv[i]);
    }
    if (!o->model) return cli_usage_error("serve", "need -m MODEL");
    if (o->api_key && !o->api_key[0]) return cli_usage_error("serve", "--api-key must not be empty");
    if (o->kv_type && strcmp(o->kv_type, "f16") && strcmp(o->kv_type, "f32") && strcmp(o->kv_type, "q8_0"))
        return cli_usage_error("serve", "invalid --kv-type '%s' (f16, q8_0, f32)", o->kv_type);
    if (o->prefix_cache && strcmp(o->prefix_cache, "on") && strcmp(o->prefix_cache, "off"))
        return cli_usage_error("serve", "invalid --prefix-cache '%s' (on, off)", o->prefix_cache);
    return 0;
}

/* Where the fallback goes, which refusals forward and whether a key is
 * sent (the variable's name, never its value). */
static void print_fallback(const srv_fallback *fb) {
    if (!fb->url) return;
    char on[80] = "";
    for (int r = 0; r < SRV_FB_N_REASONS; r++)
        if (!fb->triggers || (fb->triggers & (1u << r)))
            snprintf(on + strlen(on), sizeof on - strlen(on), "%s%s", on[0] ? ", " : "", srv_fb_reason_name(r));
    const char *env = fb->key_env ? fb->key_env : SRV_FB_DEFAULT_KEY_ENV, *key = getenv(env);
    fprintf(stderr, "kettle serve: fallback upstream %s on %s (%s $%s)\n", fb->url, on,
            key && key[0] ? "API key from" : "no API key: unset", env);
}

static kt_engine_params engine_params(const serve_opts *o) {
    kt_engine_params p = kt_engine_defaults();
    if (o->n_ctx) p.n_ctx = o->n_ctx;
    if (o->n_parallel) p.n_parallel = o->n_parallel;
    if (o->kv_mb) p.kv_bytes = (size_t)o->kv_mb << 20;
    if (o->batch_tokens) p.batch_tokens = o->batch_tokens;
    if (o->n_threads) p.n_threads = o->n_threads;
    if (o->queue_max) p.queue_max = o->queue_max;
    if (o->has_stretch) p.max_itl_stretch = o->itl_stretch;
    if (o->prefix_cache) p.prefix_cache = strcmp(o->prefix_cache, "off") != 0;
    p.cache_dir = o->cache_dir;
    p.cache_disk_bytes = (size_t)o->cache_disk_mb << 20;
    if (o->kv_type)
        p.kv_type = !strcmp(o->kv_type, "f32") ? KT_KV_F32 : !strcmp(o->kv_type, "q8_0") ? KT_KV_Q8_0 : KT_KV_F16;
    return p;
}

/* Blocks until SIGINT or SIGTERM (blocked in every thread). */
static void wait_for_signal(const sigset_t *set) {
    int sig = 0;
    while (sigwait(set, &sig) != 0) {}
    fprintf(stderr, "kettle serve: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
}

/* How /v1/embeddings pools: --embeddings' choice, else the file's
 * pooling_type (GGUF: 1 mean, 2 cls, 3 last), else mean with a bare
 * --embeddings; KT_POOL_NONE: the server does not embed. */
static kt_pooling embed_pooling(const kt_model *m, const serve_opts *o) {
    const char *p = o->embeddings;
    if (p && !strcmp(p, "mean")) return KT_POOL_MEAN;
    if (p && !strcmp(p, "last")) return KT_POOL_LAST;
    if (p && !strcmp(p, "cls")) return KT_POOL_CLS;
    switch (kt_model_describe(m)->pooling_type) {
    case 1: return KT_POOL_MEAN;
    case 2: return KT_POOL_CLS;
    case 3: return KT_POOL_LAST;
    default: return p ? KT_POOL_MEAN : KT_POOL_NONE;
    }
}

static int serve(kt_model *model, const char *tmpl, const serve_opts *o, const srv_fallback *fb,
                 const sigset_t *set) {
    kt_error err = {0};
    kt_engine_params ep = engine_params(o);
    kt_engine *engine = kt_engine_new(model, &ep, &err);
    if (!engine) return cli_fail("serve", &err);
    const char *base = strrchr(o->model, '/');
    srv_config cfg = {.host = o->host, .port = o->port, .api_key = o->api_key,
                      .model_name = base ? base + 1 : o->model, .aliases = o->aliases, .n_aliases = o->n_aliases,
                      .strict_model_names = o->strict_model_names, .template_text = tmpl,
                      .http_threads = o->http_threads, .log_format = o->log_format,
                      .result_cache = o->result_cache, .no_webui = o->no_webui,
                      .embed_pooling = embed_pooling(model, o), .fallback = *fb};
    srv_server *srv = srv_start(model, engine, &cfg, &err);
    if (!srv) {
        kt_engine_free(engine);
        return cli_fail("serve", &err);
    }
    const kt_engine_params *ap = kt_engine_get_params(engine);
    kt_engine_stats st;
    kt_engine_get_stats(engine, &st);
    fprintf(stderr, "kettle serve: model %s, ctx %d, parallel %d, batch %d tokens\n", cfg.model_name, ap->n_ctx,
            ap->n_parallel, ap->batch_tokens);
    for (int i = 0; i < cfg.n_aliases; i++) fprintf(stderr, "kettle serve: also answers to '%s'\n", cfg.aliases[i]);
    fprintf(stderr, "kettle serve: %s\n", cfg.strict_model_names ? "a request naming another model gets 404 (--strict-model-names)"
                                                                : "a request naming another model is served by this one");
    fprintf(stderr, "kettle serve: KV cache %d blocks of %d positions (%.0f MiB, %d positions), prefix cache %s\n",
            st.kv_blocks_total, st.kv_block_tokens, (double)st.kv_pool_bytes / 1048576.0,
            st.kv_blocks_total * st.kv_block_tokens, ap->prefix_cache ? "on" : "off");
    if (st.kv_wanted_bytes)
        fprintf(stderr, "kettle serve: %d x %d positions would take %.0f MiB of KV cache, more than the memory available "
                "now: the pool holds %d positions (requests wait for room; --kv-mb, --ctx or --parallel set it)\n",
                ap->n_parallel, ap->n_ctx, (double)st.kv_wanted_bytes / 1048576.0, st.kv_blocks_total * st.kv_block_tokens);
    if (ap->n_ctx > kt_model_describe(model)->n_ctx_train)
        fprintf(stderr, "kettle serve: warning: --ctx %d is beyond the %d positions the model was trained on; its output "
                "past them may degrade\n", ap->n_ctx, kt_model_describe(model)->n_ctx_train);
    if (st.kv_window_slots_total > 0)
        fprintf(stderr, "kettle serve: the sliding-window layers keep %d block slots (%.0f MiB less than full "
                "caches)\n", st.kv_window_slots_total,
                ((double)st.kv_block_bytes * st.kv_blocks_total - (double)st.kv_pool_bytes) / 1048576.0);
    print_fallback(&cfg.fallback);
    if (!o->no_webui) fprintf(stderr, "kettle serve: a chat page at / (--no-webui turns it off)\n");
    static const char *const POOLS[] = {"", "mean", "cls", "last"};
    if (cfg.embed_pooling != KT_POOL_NONE)
        fprintf(stderr, "kettle serve: /v1/embeddings: %s pooling of the last hidden states\n", POOLS[cfg.embed_pooling]);
    bool v6 = strchr(o->host, ':') != NULL; /* an IPv6 address goes in brackets */
    fprintf(stderr, "kettle serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", o->host, v6 ? "]" : "", srv_port(srv));
    wait_for_signal(set);
    srv_stop(srv); /* frees the engine too */
    return 0;
}

int cmd_serve(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    serve_opts o;
    srv_fallback fb = {0};
    int rc = parse_opts(argc, argv, &o);
    if (!rc) rc = check_fallback(&o, &fb);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt("serve", &o.model, model_path, sizeof model_path)) return 1;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    kt_error err = {0};
    if (!srv_check_listen(o.host, o.port, &err)) return cli_fail("serve", &err); /* before a long load */
    char *tmpl = o.template_arg ? cli_load_template(o.template_arg, &err) : NULL;
    if (o.template_arg && !tmpl) return cli_fail("serve", &err);
    kt_model *model = cli_load_model(o.model, o.load, &err);
    if (!model) {
        free(tmpl);
        return cli_fail("serve", &err);
    }
    if (!tmpl && !kt_model_chat_template(model))
        fprintf(stderr, "kettle serve: %s has no chat template: /v1/chat/completions will fail "
                        "(name one with --chat-template)\n", o.model);
    rc = serve(model, tmpl, &o, &fb, &set);
    kt_model_free(model);
    free(tmpl);
    return rc;
}
